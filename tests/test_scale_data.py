"""lrt_scale.data: shard format, local reader, and the downloader's retry/resume logic (no network:
file:// and fakes)."""

from __future__ import annotations

import io
import urllib.error
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from stdlib_corpus import stdlib_docs  # noqa: E402  (shared test corpus)

from lrt_scale import data


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """3 shards with row groups of 5 documents; shard 2 is validation."""
    d = tmp_path_factory.mktemp("shards")
    docs = stdlib_docs()[:90]
    for i in range(3):
        data.write_shard(docs[i * 30 : (i + 1) * 30], d / data.shard_name(i), row_group_size=5)
    return d, docs


def test_shard_format_matches_release(corpus):
    d, docs = corpus
    pf = pq.ParquetFile(d / "shard_00000.parquet")
    assert pf.schema_arrow.names == ["text"]
    assert pf.schema_arrow.field("text").type == pa.string()
    assert pf.metadata.num_row_groups == 6
    assert data.read_row_group(d / "shard_00000.parquet", 1) == docs[5:10]


def test_list_and_split_shards(corpus, tmp_path):
    d, _ = corpus
    names = [p.name for p in data.list_shards(d)]
    assert names == ["shard_00000.parquet", "shard_00001.parquet", "shard_00002.parquet"]
    assert [p.name for p in data.split_shards(data.list_shards(d), "train")] == names[:2]
    assert [p.name for p in data.split_shards(data.list_shards(d), "val")] == names[2:]
    # unfinished downloads and unrelated files are ignored
    (tmp_path / "shard_00000.parquet.part").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "shard_1.parquet").write_text("x")
    assert data.list_shards(tmp_path) == []


def test_split_is_by_shard_index_not_argument_order(corpus):
    d, _ = corpus
    shards = list(reversed(data.list_shards(d)))
    assert data.split_shards(shards, "val")[0].name == "shard_00002.parquet"


def test_row_groups_enumerate_across_shards(corpus):
    d, _ = corpus
    rgs = data.row_groups(data.resolve_shards(d, "train"))
    assert [(r.shard, r.row_group) for r in rgs] == [(s, g) for s in (0, 1) for g in range(6)]
    assert all(r.num_rows == 5 for r in rgs)


@pytest.mark.parametrize("world_size", [1, 2, 5])
def test_ranks_partition_documents(corpus, world_size):
    d, docs = corpus
    per_rank = [
        list(data.iter_documents(d, "train", rank=r, world_size=world_size))
        for r in range(world_size)
    ]
    flat = [doc for part in per_rank for doc in part]
    assert sorted(flat) == sorted(docs[:60])
    assert len(flat) == 60  # no document twice
    # rank r reads global row groups r, r + world_size, ...
    rgs = data.row_groups(data.resolve_shards(d, "train"))
    for r in range(world_size):
        assert per_rank[r] == [t for rg in rgs[r::world_size] for t in rg.read()]


def test_val_split_and_explicit_shard_list(corpus):
    d, docs = corpus
    assert list(data.iter_documents(d, "val")) == docs[60:90]
    files = data.list_shards(d)
    assert list(data.iter_documents(files, "train")) == docs[:60]


def test_text_iterator_stops_after_max_chars(corpus):
    d, docs = corpus
    out = list(data.text_iterator(d, max_chars=1000))
    assert sum(map(len, out[:-1])) < 1000 <= sum(map(len, out))
    assert out == docs[: len(out)]


def test_reader_errors_name_the_field(corpus, tmp_path):
    d, _ = corpus
    with pytest.raises(ValueError, match="split"):
        data.split_shards(data.list_shards(d), "test")
    with pytest.raises(ValueError, match="data_dir"):
        data.list_shards(tmp_path / "missing")
    with pytest.raises(ValueError, match="data_dir"):
        data.resolve_shards(tmp_path, "train")  # empty directory
    with pytest.raises(ValueError, match="shards"):
        data.split_shards(data.list_shards(d)[:1], "train")  # one shard is val only
    with pytest.raises(ValueError, match="shards"):
        data.resolve_shards([tmp_path / "shard_00000.parquet"], "val")
    with pytest.raises(ValueError, match="rank"):
        list(data.iter_documents(d, rank=2, world_size=2))
    with pytest.raises(ValueError, match="world_size"):
        list(data.iter_documents(d, rank=0, world_size=0))
    with pytest.raises(ValueError, match="row_group_size"):
        data.write_shard(["a"], tmp_path / "x.parquet", row_group_size=0)
    pq.write_table(pa.table({"content": ["a"]}), tmp_path / "shard_00000.parquet")
    with pytest.raises(ValueError, match="'text' column"):
        data.row_groups([tmp_path / "shard_00000.parquet"])


def test_shard_names_and_download_plan():
    assert data.shard_name(7) == "shard_00007.parquet"
    assert data.shard_url(1822) == data.BASE_URL + "/shard_01822.parquet"
    assert data.shards_to_download(3) == [0, 1, 2, data.NUM_SHARDS - 1]
    assert data.shards_to_download(2, total_shards=5, include_val=False) == [0, 1]
    with pytest.raises(ValueError, match="num_shards"):
        data.shards_to_download(data.NUM_SHARDS)
    with pytest.raises(ValueError, match="index"):
        data.shard_name(-1)


# -------------------------------------------------------------------------------------------
# downloader
class FakeResponse(io.BytesIO):
    def __init__(self, body: bytes, status: int = 200, content_length: int | None = None):
        super().__init__(body)
        self.status = status
        self.headers = {} if content_length is None else {"Content-Length": str(content_length)}


class FakeServer:
    """An ``opener`` that serves ``payload``, honours Range (206) unless told not to, and can fail
    on cue."""

    def __init__(self, payload: bytes, script=(), honour_range=True):
        self.payload, self.script, self.honour_range = payload, list(script), honour_range
        self.ranges: list[str | None] = []

    def __call__(self, req, timeout):
        rng = req.get_header("Range")
        self.ranges.append(rng)
        action = self.script.pop(0) if self.script else "ok"
        if isinstance(action, BaseException):
            raise action
        start = int(rng[len("bytes=") : -1]) if rng and self.honour_range else 0
        body = self.payload[start:]
        status = 206 if start else 200
        if action == "truncate":  # connection drops half way: fewer bytes than Content-Length
            return FakeResponse(body[: len(body) // 2], status, content_length=len(body))
        return FakeResponse(body, status, content_length=len(body))


@pytest.fixture
def payload(corpus):
    d, _ = corpus
    return (d / "shard_00001.parquet").read_bytes()


def test_download_from_file_url(corpus, tmp_path):
    d, _ = corpus
    dest = data.download_file(
        (d / "shard_00001.parquet").as_uri(), tmp_path / "out" / "shard_00001.parquet"
    )
    assert dest.read_bytes() == (d / "shard_00001.parquet").read_bytes()
    assert not (tmp_path / "out" / "shard_00001.parquet.part").exists()


def test_download_resumes_from_part_file(payload, tmp_path):
    dest = tmp_path / "shard_00001.parquet"
    (tmp_path / "shard_00001.parquet.part").write_bytes(payload[:1000])
    server = FakeServer(payload)
    data.download_file("http://x/shard", dest, opener=server, sleep=lambda s: None)
    assert server.ranges == ["bytes=1000-"]
    assert dest.read_bytes() == payload


def test_download_restarts_when_server_ignores_range(payload, tmp_path):
    dest = tmp_path / "shard_00001.parquet"
    (tmp_path / "shard_00001.parquet.part").write_bytes(b"garbage" * 10)
    server = FakeServer(payload, honour_range=False)
    data.download_file("http://x/shard", dest, opener=server, sleep=lambda s: None)
    assert dest.read_bytes() == payload


def test_download_retries_with_backoff_and_resumes_truncated_reads(payload, tmp_path):
    sleeps = []
    server = FakeServer(
        payload, script=[urllib.error.URLError("reset"), "truncate", TimeoutError("slow"), "ok"]
    )
    dest = data.download_file(
        "http://x/shard",
        tmp_path / "s.parquet",
        opener=server,
        sleep=sleeps.append,
        retries=5,
        backoff=0.5,
    )
    assert dest.read_bytes() == payload
    assert sleeps == [0.5, 1.0, 2.0]
    half = (len(payload)) // 2
    assert server.ranges == [None, None, f"bytes={half}-", f"bytes={half}-"]


def test_download_gives_up_but_keeps_part_for_next_run(payload, tmp_path):
    server = FakeServer(
        payload, script=["truncate", urllib.error.URLError("down"), urllib.error.URLError("down")]
    )
    dest = tmp_path / "s.parquet"
    with pytest.raises(RuntimeError, match="giving up after 3 attempts"):
        data.download_file("http://x/shard", dest, opener=server, sleep=lambda s: None, retries=2)
    part = tmp_path / "s.parquet.part"
    assert part.read_bytes() == payload[: len(payload) // 2]
    # the next run resumes
    data.download_file("http://x/shard", dest, opener=server, sleep=lambda s: None)
    assert dest.read_bytes() == payload and not part.exists()


def test_download_does_not_retry_a_404(tmp_path):
    sleeps = []
    err = urllib.error.HTTPError("http://x", 404, "Not Found", {}, None)
    with pytest.raises(data.PermanentDownloadError, match="404"):
        data.download_file(
            "http://x/shard",
            tmp_path / "s.parquet",
            opener=FakeServer(b"", [err]),
            sleep=sleeps.append,
        )
    assert sleeps == []


def test_download_rejects_a_non_parquet_body(tmp_path):
    server = FakeServer(b"<html>rate limited</html>")
    with pytest.raises(RuntimeError, match="giving up"):
        data.download_file(
            "http://x/shard", tmp_path / "s.parquet", opener=server, sleep=lambda s: None, retries=1
        )
    assert not (tmp_path / "s.parquet").exists() and not (tmp_path / "s.parquet.part").exists()


def test_download_shards_fetches_train_and_val_and_skips_finished(corpus, tmp_path):
    d, _ = corpus
    src = tmp_path / "remote"
    src.mkdir()
    for i in (0, 1, 4):
        (src / data.shard_name(i)).write_bytes((d / data.shard_name(i % 3)).read_bytes())
    calls = []

    def opener(req, timeout):
        calls.append(req.full_url)
        return FakeResponse(Path(req.full_url[len("file://") :]).read_bytes())

    out = tmp_path / "local"
    paths = data.download_shards(
        2, out, base_url=src.as_uri(), total_shards=5, opener=opener, workers=2
    )
    assert [p.name for p in paths] == [
        "shard_00000.parquet",
        "shard_00001.parquet",
        "shard_00004.parquet",
    ]
    assert [p.name for p in data.split_shards(data.list_shards(out), "val")] == [
        "shard_00004.parquet"
    ]
    n = len(calls)
    data.download_shards(2, out, base_url=src.as_uri(), total_shards=5, opener=opener)
    assert len(calls) == n  # nothing re-fetched


def test_cli_download_and_info(corpus, tmp_path, capsys):
    d, _ = corpus
    src = tmp_path / "remote"
    src.mkdir()
    for i in (0, 1, data.NUM_SHARDS - 1):
        (src / data.shard_name(i)).write_bytes((d / data.shard_name(i % 3)).read_bytes())
    out = tmp_path / "local"
    assert (
        data.main(["download", "--shards", "2", "--dir", str(out), "--base-url", src.as_uri()]) == 0
    )
    assert [p.name for p in data.list_shards(out)] == [
        "shard_00000.parquet",
        "shard_00001.parquet",
        "shard_01822.parquet",
    ]
    data.main(["info", "--dir", str(out)])
    text = capsys.readouterr().out
    assert "train: 2 shards, 12 row groups, 60 documents" in text
    assert "val: 1 shards, 6 row groups, 30 documents" in text
