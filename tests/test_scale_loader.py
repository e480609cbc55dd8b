"""lrt_scale.loader: rank partition, best-fit packing, token accounting and exact resume on a tiny
local corpus.

Most tests use ``IdTokenizer``, which gives every (document, position) its own token id, so each
emitted token can be traced back to the document and position it came from. One test uses a real
trained BPE end to end.
"""

from __future__ import annotations

import email
import json
import re
import time
from pathlib import Path

import pytest
import torch

from lrt_scale import data
from lrt_scale.loader import DistributedPackingLoader, describe
from lrt_scale.tokenizer import train_tokenizer

STRIDE = 10_000  # token id = (doc + 1) * STRIDE + position; BOS = 0
BOS = 0


def stdlib_docs() -> list[str]:
    """A tiny real corpus: the json and email packages'
    sources, one document per top-level block."""
    docs = []
    for pkg in (json, email):
        for f in sorted(Path(pkg.__file__).parent.glob("*.py")):
            docs += [p for p in re.split(r"\n\n\n+", f.read_text(encoding="utf-8")) if p.strip()]
    return list(dict.fromkeys(docs))  # unique, so a text identifies its document


class IdTokenizer:
    """Stand-in tokenizer: document ``i`` becomes ``n_i`` unique ids ``(i+1)*STRIDE + j``."""

    bos_token_id = BOS

    def __init__(self, docs: list[str], lengths: dict[str, int] | None = None):
        self.index = {t: i for i, t in enumerate(docs)}
        self.lengths = lengths or {t: max(1, len(t) // 16) for t in docs}
        assert max(self.lengths.values()) < STRIDE

    def ids(self, text: str) -> list[int]:
        i = self.index[text]
        return [(i + 1) * STRIDE + j for j in range(self.lengths[text])]

    def encode_batch(self, texts, prepend_bos=False, num_threads=1):
        return [[BOS] * prepend_bos + self.ids(t) for t in texts]


def doc_of(token: int) -> tuple[int, int]:
    return token // STRIDE - 1, token % STRIDE


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """3 shards of 40 docs in row groups of 4: train = 80 docs
    / 20 row groups, val = 40 docs / 10."""
    d = tmp_path_factory.mktemp("fineweb")
    docs = stdlib_docs()[:120]
    for i in range(3):
        data.write_shard(docs[i * 40 : (i + 1) * 40], d / data.shard_name(i), row_group_size=4)
    return d, docs


def make(corpus, **kw):
    d, docs = corpus
    args = dict(batch_size=4, seq_len=64, rank=0, world_size=1, buffer_docs=16)
    args.update(kw)
    tok = args.pop("tokenizer", None) or IdTokenizer(docs)
    return DistributedPackingLoader(d, tok, **args)


def rows_of(batches) -> list[list[int]]:
    """Rebuild the (T+1)-token rows from (inputs, targets),
    checking the one-token shift on the way."""
    out = []
    for x, y in batches:
        assert torch.equal(x[:, 1:], y[:, :-1])
        out += torch.cat([x, y[:, -1:]], dim=1).tolist()
    return out


def take(loader, n):
    return [next(loader) for _ in range(n)]


def test_batch_shapes_and_bos_aligned_rows(corpus):
    loader = make(corpus)
    x, y = next(loader)
    assert x.shape == y.shape == (4, 64) and x.dtype == y.dtype == torch.long
    assert x.is_contiguous() and y.is_contiguous() and x.device.type == "cpu"
    rows = rows_of([(x, y)] + take(loader, 5))
    assert all(row[0] == BOS for row in rows)  # "drop" never starts a row mid-document
    assert loader.tokens_per_batch == 4 * 64


def test_rank_reads_every_world_size_th_row_group(corpus):
    d, _ = corpus
    everything = data.row_groups(data.resolve_shards(d, "train"))
    for r in range(3):
        loader = make(corpus, rank=r, world_size=3)
        assert [(g.shard, g.row_group) for g in loader.row_groups] == [
            (g.shard, g.row_group) for g in everything[r::3]
        ]
        assert describe(loader).startswith(f"rank {r}/3 train: {len(everything[r::3])} row groups")


def _epoch_rows(corpus, remainder, world_size=2):
    d, docs = corpus
    out = []
    for r in range(world_size):
        loader = make(corpus, rank=r, world_size=world_size, epochs=1, remainder=remainder)
        rows = rows_of(loader)
        assert loader.stats["batches"] == len(rows) // 4
        rank_docs = {docs.index(t) for g in loader.row_groups for t in g.read()}
        out.append((rows, loader.stats, rank_docs))
    return out


def test_drop_policy_every_emitted_token_from_the_corpus_once(corpus):
    _, docs = corpus
    tok = IdTokenizer(docs)
    train = docs[:80]
    seen: dict[int, int] = {}  # doc -> tokens emitted (excluding its BOS)
    read = 0
    for rows, stats, rank_docs in _epoch_rows(corpus, "drop"):
        bare_bos = 0
        for row in rows:
            assert row[0] == BOS
            starts = [i for i, t in enumerate(row) if t == BOS] + [len(row)]
            for a, b in zip(starts, starts[1:]):
                seg = row[a + 1 : b]
                if not seg:
                    bare_bos += 1  # a document cropped right after its BOS
                    continue
                doc, _ = doc_of(seg[0])
                assert doc in rank_docs, "a rank emitted a document of another rank's row groups"
                assert doc not in seen, "document emitted twice"
                assert seg == tok.ids(docs[doc])[: len(seg)], (
                    "not a prefix of the document, in order"
                )
                seen[doc] = len(seg)
        emitted = sum(map(len, rows))
        assert emitted == stats["tokens_emitted"]
        assert stats["tokens_read"] == emitted + stats["tokens_cropped"] + stats["tokens_tail"]
        assert stats["tokens_cropped"] > 0  # the policy is exercised
        read += stats["tokens_read"]
    # both ranks together read every train document exactly once
    assert read == sum(len(tok.ids(t)) + 1 for t in train)
    assert set(seen) <= set(range(80))


def test_carry_policy_loses_nothing_but_the_final_partial_batch(corpus):
    _, docs = corpus
    tok = IdTokenizer(docs)
    emitted_pos: dict[int, list[int]] = {}
    tail = emitted_total = n_bos = 0
    for rows, stats, rank_docs in _epoch_rows(corpus, "carry"):
        assert stats["tokens_cropped"] == 0
        for row in rows:
            for t in row:
                if t == BOS:
                    n_bos += 1
                    continue
                doc, pos = doc_of(t)
                assert doc in rank_docs
                emitted_pos.setdefault(doc, []).append(pos)
        emitted_total += stats["tokens_emitted"]
        tail += stats["tokens_tail"]
        assert stats["tokens_read"] == stats["tokens_emitted"] + stats["tokens_tail"]
    # every document's tokens come out once each, in order (pieces concatenate back to a prefix of
    # it)
    for doc, pos in emitted_pos.items():
        assert pos == list(range(len(pos))), f"document {doc} out of order or duplicated"
    full = sum(len(tok.ids(t)) + 1 for t in docs[:80])
    assert emitted_total == n_bos + sum(map(len, emitted_pos.values()))
    # at most the last partial batch per rank
    assert full == emitted_total + tail and tail < 2 * 4 * 65
    complete = [d for d, p in emitted_pos.items() if len(p) == len(tok.ids(docs[d]))]
    assert len(complete) >= 70


def test_best_fit_and_crop_on_crafted_documents(tmp_path):
    texts = [f"doc{i}" for i in range(6)]
    lengths = dict(zip(texts, [6, 4, 3, 2, 8, 1]))  # + BOS: 7 5 4 3 9 2
    data.write_shard(texts, tmp_path / data.shard_name(0))
    data.write_shard(["val"], tmp_path / data.shard_name(1))
    tok = IdTokenizer(texts, lengths)

    def doc(i, n=None):
        return [BOS, *tok.ids(texts[i])][:n]

    def run(remainder):
        loader = DistributedPackingLoader(
            tmp_path,
            tok,
            batch_size=1,
            seq_len=9,
            rank=0,
            world_size=1,
            buffer_docs=6,
            epochs=1,
            remainder=remainder,
        )
        return rows_of(loader), loader.stats

    rows, stats = run("drop")
    # row 1: longest that fits (9), then nothing fits the last slot: crop the shortest (2 -> 1)
    # row 2: 7, then 3 fills it; row 3: 5 + 4 = 9 < 10 and the data is out: dropped as the tail
    assert rows == [doc(4) + doc(5, 1), doc(0) + doc(3)]
    assert (stats["tokens_cropped"], stats["tokens_tail"], stats["tokens_read"]) == (1, 9, 30)
    rows, stats = run("carry")
    # the cropped remainder (doc 5's one token, no BOS) later completes row 3
    assert rows == [doc(4) + doc(5, 1), doc(0) + doc(3), doc(1) + doc(2) + tok.ids(texts[5])]
    assert (stats["tokens_cropped"], stats["tokens_tail"], stats["tokens_emitted"]) == (0, 0, 30)


def test_loader_is_deterministic(corpus):
    a = rows_of(take(make(corpus, rank=1, world_size=2), 10))
    b = rows_of(take(make(corpus, rank=1, world_size=2), 10))
    assert a == b


@pytest.mark.parametrize("remainder", ["drop", "carry"])
def test_resume_is_exact_across_epochs(corpus, remainder):
    n = 40
    reference = rows_of(take(make(corpus, rank=1, world_size=2, remainder=remainder), n))
    got, state, epochs_at_cut = [], None, []
    for stop in (3, 17, n):  # two resumes; the second lies beyond the first epoch
        loader = make(corpus, rank=1, world_size=2, remainder=remainder, state=state)
        got += rows_of(take(loader, stop - len(got) // 4))
        state = json.loads(json.dumps(loader.state_dict()))  # checkpoints hold plain data
        epochs_at_cut.append(state["epoch"])
    assert got == reference
    assert epochs_at_cut[1] >= 1, "test should resume after an epoch boundary"
    assert state["stats"]["batches"] == n


def test_resume_with_real_tokenizer(corpus):
    d, docs = corpus
    tok = train_tokenizer(data.text_iterator(d), vocab_size=512)
    kw = dict(tokenizer=tok, batch_size=2, seq_len=128, rank=0, world_size=2)
    reference = rows_of(take(make(corpus, **kw), 12))
    first = make(corpus, **kw)
    head = rows_of(take(first, 5))
    state = first.state_dict()
    assert {"shard", "row_group", "epoch", "doc"} <= set(state)
    tail = rows_of(take(make(corpus, state=state, **kw), 7))
    assert head + tail == reference
    assert all(row[0] == tok.bos_token_id for row in reference)
    text = tok.decode(reference[0][1:])
    assert text.split("<|bos|>")[0] in "".join(docs)  # real text comes out


@pytest.mark.parametrize("remainder", ["drop", "carry"])
def test_prefetching_gives_the_same_batches_states_and_resume(corpus, remainder):
    """prefetch=2 packs ahead in a thread: the same batches as the synchronous loader, and after
    each batch the same state_dict, stats and epoch (those of the batch returned, not of the ones
    packed ahead); a resume from its state continues as the synchronous loader does."""
    sync = make(corpus, remainder=remainder)
    ahead = make(corpus, remainder=remainder, prefetch=2)
    assert ahead.state_dict() == sync.state_dict()
    for _ in range(25):  # past an epoch (80 docs)
        a, b = next(sync), next(ahead)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert ahead.state_dict() == sync.state_dict()
        assert ahead.stats == sync.stats and ahead.epoch == sync.epoch
    for _ in range(500):  # the thread packs ahead while nothing is asked of it
        if ahead._queue.qsize() == 2:
            break
        time.sleep(0.01)
    assert ahead._queue.qsize() == 2 and ahead.state_dict() == sync.state_dict()
    state = ahead.state_dict()
    ahead.close()
    assert ahead.state_dict() == state  # closing rewinds the packing to what was returned
    resumed = make(corpus, remainder=remainder, prefetch=1, state=state)
    after_close = next(ahead)
    want = next(sync)
    for got in (next(resumed), after_close):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ahead.close()
    resumed.close()


def test_prefetching_ends_and_raises_like_the_synchronous_loader(corpus):
    sync, ahead = make(corpus, epochs=1), make(corpus, epochs=1, prefetch=3)
    assert len(list(sync)) == len(list(ahead)) > 0
    assert ahead.stats == sync.stats  # the tail of the last, incomplete batch counted too
    with pytest.raises(StopIteration):
        next(ahead)

    class Broken(IdTokenizer):
        def encode_batch(self, texts, prepend_bos=False, num_threads=1):
            raise RuntimeError("tokenizer failed")

    broken = make(corpus, prefetch=2, tokenizer=Broken(corpus[1]))
    with pytest.raises(RuntimeError, match="tokenizer failed"):
        next(broken)
    with pytest.raises(ValueError, match="prefetch"):
        make(corpus, prefetch=-1)


def test_state_before_iterating_and_at_end(corpus):
    loader = make(corpus, epochs=1)
    assert list(make(corpus, state=loader.state_dict(), epochs=1)) and sum(1 for _ in loader) > 0
    with pytest.raises(StopIteration):
        next(loader)  # stays exhausted
    rest = make(corpus, epochs=1, state=loader.state_dict())
    assert list(rest) == []


def test_val_split_reads_only_the_last_shard(corpus):
    _, docs = corpus
    rows = rows_of(make(corpus, split="val", epochs=1, remainder="carry"))
    docs_seen = {doc_of(t)[0] for row in rows for t in row if t != BOS}
    assert docs_seen and docs_seen <= set(range(80, 120))


def test_explicit_shard_list_and_env_rank(corpus, monkeypatch):
    d, docs = corpus
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = DistributedPackingLoader(
        data.list_shards(d), IdTokenizer(docs), batch_size=2, seq_len=32, buffer_docs=16
    )
    assert (loader.rank, loader.world_size) == (1, 2)
    assert rows_of(take(loader, 3)) == rows_of(
        take(make(corpus, batch_size=2, seq_len=32, rank=1, world_size=2), 3)
    )


def test_cpu_device_skips_pinned_memory(corpus):
    loader = make(corpus)
    x, _ = next(loader)
    assert not loader._pin and not x.is_pinned()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_pinned_non_blocking_matches_cpu(corpus):
    cpu = make(corpus, remainder="carry")
    gpu = make(corpus, remainder="carry", device="cuda")
    assert all(h.is_pinned() for h in gpu._host)
    kept = []
    for _ in range(6):  # more batches than host buffers: reuse must not corrupt earlier batches
        kept.append((next(cpu), next(gpu)))
    for (xc, yc), (xg, yg) in kept:
        assert xg.is_cuda and torch.equal(xc, xg.cpu()) and torch.equal(yc, yg.cpu())


def test_bad_arguments_name_the_field(corpus, tmp_path):
    d, docs = corpus
    cases = [
        (dict(split="test"), "split"),
        (dict(batch_size=0), "batch_size"),
        (dict(seq_len=0), "seq_len"),
        (dict(buffer_docs=0), "buffer_docs"),
        (dict(rank=2, world_size=2), "rank"),
        (dict(world_size=0), "world_size"),
        (dict(remainder="keep"), "remainder"),
        (dict(epochs=0), "epochs"),
        (
            dict(split="val", rank=10, world_size=11),
            "world_size",
        ),  # val has 10 row groups: rank 10 gets none
    ]
    if not torch.cuda.is_available():
        cases.append((dict(device="cuda"), "device"))
    for kw, field in cases:
        with pytest.raises(ValueError, match=field):
            make(corpus, **kw)
    with pytest.raises(ValueError, match="data_dir"):
        DistributedPackingLoader(tmp_path / "missing", IdTokenizer(docs), 1, 8, 0, 1)


def test_mismatched_state_is_rejected(corpus, tmp_path):
    state = make(corpus, rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="rank"):
        make(corpus, rank=1, world_size=2, state=state)
    with pytest.raises(ValueError, match="remainder"):
        make(corpus, rank=0, world_size=2, remainder="carry", state=state)
    with pytest.raises(ValueError, match="version"):
        make(corpus, rank=0, world_size=2, state={**state, "version": 0})
    with pytest.raises(ValueError, match="different data"):
        make(corpus, rank=0, world_size=2, state={**state, "shard": 7})


def test_an_empty_split_raises_instead_of_spinning(tmp_path):
    """An endless loader over row groups that hold no documents would wrap epochs forever."""
    data.write_shard([], tmp_path / data.shard_name(0))  # train: no documents
    data.write_shard(["val"], tmp_path / data.shard_name(1))
    with pytest.raises(ValueError, match="split: 'train' holds no documents"):
        DistributedPackingLoader(
            tmp_path, IdTokenizer(["val"]), batch_size=1, seq_len=8, rank=0, world_size=1
        )
    loader = DistributedPackingLoader(
        tmp_path, IdTokenizer(["val"]), batch_size=1, seq_len=2, rank=0, world_size=1, split="val"
    )
    assert next(loader)[0].tolist() == [[BOS, *IdTokenizer(["val"]).ids("val")][:2]]
