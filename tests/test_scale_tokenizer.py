"""lrt_scale.tokenizer: byte-level BPE trained on a tiny stdlib corpus (vocab 512 keeps it fast)."""

from __future__ import annotations

import json

import pytest
import torch

from lrt_scale.tokenizer import BOS, SPECIAL_TOKENS, Tokenizer, _capped, train_tokenizer

VOCAB = 512

EDGE_CASES = [
    "",
    " ",
    "  \t \n\n\r\n\r",
    "\x00",
    "\x00\x01\x1f\x7f",
    "\x80\x9f\xa0\xff",  # C1 controls and Latin-1 top: 2-byte UTF-8
    "ÿĀ€",
    "日本語のテキスト，中文文本",
    "👩‍👩‍👧‍👦 🇫🇷 😀😀😀",  # ZWJ sequence, regional-indicator flag, 4-byte chars
    "e\u0301 n\u0303 \u0915\u094d\u0937",  # combining marks, Devanagari conjunct
    "مرحبا بالعالم שלום",  # right-to-left scripts
    "\ufeffBOM then text \u2028\u2029 separators",
    "\uffff\U0010ffff\U0001f600",  # max BMP, max code point
    "DON'T we'll they're I'M",  # contractions, case-insensitive split
    "1234567890 3.14159 1e-9 0x1F",
    "<|bos|> <|user_start|> looks special but is text",
    "a" * 5000,
    " " * 300 + "x",
    "def f(x):\n    return {'a': [1, 2, 3]}\n",
]


from stdlib_corpus import stdlib_docs  # noqa: E402  (shared test corpus)


@pytest.fixture(scope="module")
def docs():
    return stdlib_docs()


@pytest.fixture(scope="module")
def tok(docs):
    return train_tokenizer(iter(docs), vocab_size=VOCAB)


def test_vocab_layout(tok):
    assert tok.vocab_size == VOCAB
    assert tok.n_ordinary == VOCAB - len(SPECIAL_TOKENS)
    assert tok.bos_token_id == tok.n_ordinary == tok.special_token_id(BOS)
    assert [tok.special_token_id(s) for s in SPECIAL_TOKENS] == list(range(tok.n_ordinary, VOCAB))
    # ranks 0..255 are the single bytes in byte order, so an ordinary id is its tiktoken rank
    assert all(tok.id_to_bytes(b) == bytes([b]) for b in range(256))
    assert tok.id_to_bytes(tok.bos_token_id) == BOS.encode()


def test_learned_merges_compress_the_corpus(tok, docs):
    n_bytes = sum(len(d.encode()) for d in docs)
    n_tokens = sum(len(ids) for ids in tok.encode_batch(docs))
    assert n_tokens < 0.6 * n_bytes
    # indentation, keyword
    assert b"   " in tok.mergeable_ranks and b" return" in tok.mergeable_ranks


@pytest.mark.parametrize("text", EDGE_CASES, ids=range(len(EDGE_CASES)))
def test_round_trip_and_byte_lengths(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode_bytes(ids) == text.encode("utf-8")
    assert int(tok.token_bytes()[torch.tensor(ids, dtype=torch.long)].sum()) == len(
        text.encode("utf-8")
    )
    assert all(i < tok.n_ordinary for i in ids)  # no special token from plain text, even "<|bos|>"


def test_round_trip_on_corpus_and_token_bytes_sum(tok, docs):
    tb = tok.token_bytes()
    batch = tok.encode_batch(docs, num_threads=2)
    for text, ids in zip(docs, batch):
        assert tok.decode(ids) == text
        assert int(tb[torch.tensor(ids)].sum()) == len(text.encode("utf-8"))


def test_token_bytes_table(tok):
    tb = tok.token_bytes()
    assert tb.dtype == torch.long and tb.shape == (VOCAB,)
    assert torch.all(tb[tok.n_ordinary :] == 0)  # special tokens count no bytes in BPB
    assert torch.all(tb[: tok.n_ordinary] >= 1)
    assert all(int(tb[i]) == len(tok.id_to_bytes(i)) for i in range(tok.n_ordinary))


def test_prepend_bos_and_batch_match_single(tok):
    texts = EDGE_CASES[5:12]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    with_bos = tok.encode_batch(texts, prepend_bos=True, num_threads=1)
    assert with_bos == [[tok.bos_token_id, *tok.encode(t)] for t in texts]
    assert tok.encode("hi", prepend_bos=True)[0] == tok.bos_token_id
    assert tok.decode(tok.encode("hi", prepend_bos=True)) == BOS + "hi"


def test_lone_surrogate_and_split_characters(tok):
    # a lone surrogate cannot be UTF-8 encoded: it becomes U+FFFD (tiktoken's behaviour), never an
    # error
    assert tok.decode(tok.encode("a\ud800b")) == "a\ufffdb"
    # decoding a slice that cuts a multi-byte character: exact bytes, or U+FFFD in text
    ids = tok.encode("😀")
    assert len(ids) >= 2  # a 512-token vocab has no merge for a rare 4-byte char
    assert tok.decode_bytes(ids[:1]) == "😀".encode()[: len(tok.id_to_bytes(ids[0]))]
    assert "\ufffd" in tok.decode(ids[:1])
    with pytest.raises(UnicodeDecodeError):
        tok.decode(ids[:1], errors="strict")


def test_digits_split_in_pairs(tok):
    ids = tok.encode("1234567")
    pieces = [tok.id_to_bytes(i) for i in ids]
    assert b"".join(pieces) == b"1234567" and all(len(p) <= 2 for p in pieces)


def test_save_load_round_trip(tok, docs, tmp_path):
    tok.save(tmp_path / "tok")
    again = Tokenizer.load(tmp_path / "tok")
    assert again.vocab_size == tok.vocab_size and again.bos_token_id == tok.bos_token_id
    assert again.mergeable_ranks == tok.mergeable_ranks
    assert again.encode_batch(docs[:50]) == tok.encode_batch(docs[:50])
    assert torch.equal(again.token_bytes(), tok.token_bytes())


def test_training_is_deterministic(tok, docs):
    assert train_tokenizer(docs, vocab_size=VOCAB).mergeable_ranks == tok.mergeable_ranks


def test_custom_special_tokens(docs):
    t = train_tokenizer(docs[:40], vocab_size=300, special_tokens=(BOS, "<|eot|>"))
    assert t.vocab_size == 300 and t.special_token_id("<|eot|>") == 299 and t.bos_token_id == 298


def test_capped_text_iterator():
    assert list(_capped(["abcdef", "ghij", "klm"], max_chars=8, doc_cap=None)) == ["abcdef", "gh"]
    assert list(_capped(["abcdef", "ghij"], max_chars=None, doc_cap=3)) == ["abc", "ghi"]


def test_errors_name_the_field(tok, tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=260)
    with pytest.raises(ValueError, match="max_chars"):
        train_tokenizer(["abc"], vocab_size=300, max_chars=0)
    with pytest.raises(ValueError, match="special_tokens"):
        Tokenizer(tok.mergeable_ranks, special_tokens=("<|eot|>",))
    with pytest.raises(ValueError, match="mergeable_ranks"):
        Tokenizer({b"a": 0})
    with pytest.raises(ValueError, match="num_threads"):
        tok.encode_batch(["a"], num_threads=0)
    with pytest.raises(ValueError, match="ids"):
        tok.decode([VOCAB])
    with pytest.raises(ValueError, match="token"):
        tok.special_token_id("<|nope|>")
    with pytest.raises(ValueError, match="directory"):
        Tokenizer.load(tmp_path)
    tok.save(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer.json").read_text())
    (tmp_path / "tokenizer.json").write_text(json.dumps({**cfg, "format_version": 99}))
    with pytest.raises(ValueError, match="format_version"):
        Tokenizer.load(tmp_path)


def test_command_line_trains_saves_and_describes_a_tokenizer(docs, tmp_path, capsys):
    """`python -m lrt_scale.tokenizer train` reads only the shards' training split (the last shard
    is validation) and saves what Tokenizer.load reads back; bad input is one line, exit code 2."""
    from lrt_scale.data import write_shard
    from lrt_scale.tokenizer import main

    data = tmp_path / "shards"
    data.mkdir()
    write_shard(docs[: len(docs) // 2], data / "shard_00000.parquet")
    write_shard(["zzzz validation only zzzz"] * 50, data / "shard_00001.parquet")
    out = tmp_path / "tok"
    assert main(["train", "--data-dir", str(data), "--out", str(out), "--vocab-size", "300"]) == 0
    tok = Tokenizer.load(out)
    assert tok.vocab_size <= 300 and tok.decode(tok.encode(docs[0])) == docs[0]
    assert len(tok.encode("zzzz")) >= 2  # frequent only in the validation shard: never merged
    assert (
        main(["info", "--dir", str(out)]) == 0
        and f"{tok.vocab_size:,} tokens" in capsys.readouterr().out
    )
    assert main(["train", "--data-dir", str(data), "--out", str(out), "--vocab-size", "10"]) == 2
    assert "vocab_size" in capsys.readouterr().err
