"""FineWeb-Edu shards: the on-disk format, a resumable downloader and a local reader.

Format
------
The data is nanochat's pre-shuffled FineWeb-Edu 100BT release on the Hugging Face hub
(``karpathy/fineweb-edu-100b-shuffle``): parquet files ``shard_00000.parquet`` ..
``shard_01822.parquet``, each with one string column ``text`` (one document per row) split into row
groups (about 1024 documents each). Documents were shuffled globally before sharding, so no further
shuffling is needed and row groups are the natural unit of distributed reading (see
``lrt_scale.loader``).

Train / validation split
------------------------
In a data directory the **last shard (highest index) is validation, every other shard is train**.
The downloader always fetches the release's last shard (``shard_01822``) in addition to the first
``N`` train shards, so the validation set is the same whatever ``N`` you downloaded and is never
trained on.

Downloading (the only part that needs the network; everything else works from a local directory)::

    python -m lrt_scale.data download --shards 240 --dir ~/.cache/lrt_lab/fineweb

Each file is fetched to ``NAME.part`` and renamed atomically when complete, so a finished
``shard_*.parquet`` is always whole. An interrupted download resumes from the ``.part`` size with an
HTTP ``Range`` request (falling back to a fresh download if the server ignores it), and transient
errors are retried with exponential backoff. Re-running the command skips finished shards.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

BASE_URL = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
NUM_SHARDS = 1823  # shard_00000 .. shard_01822; the last one is validation
SHARD_RE = re.compile(r"^shard_(\d{5})\.parquet$")
TEXT_COLUMN = "text"
SPLITS = ("train", "val")
DEFAULT_DATA_DIR = Path(
    os.environ.get("LRT_DATA_DIR", Path.home() / ".cache" / "lrt_lab" / "fineweb")
)
_CHUNK = 1 << 20
_PARQUET_MAGIC = b"PAR1"


def shard_name(index: int) -> str:
    if not 0 <= index <= 99999:
        raise ValueError(f"index: shard index must be in [0, 99999], got {index}")
    return f"shard_{index:05d}.parquet"


def shard_url(index: int, base_url: str = BASE_URL) -> str:
    return f"{base_url.rstrip('/')}/{shard_name(index)}"


# ----------------------------------------------------------------------------------------------
# writing
def write_shard(texts: Iterable[str], path: str | os.PathLike, row_group_size: int = 1024) -> Path:
    """Write documents as a shard in the release's format (``text`` column, ``row_group_size`` docs
    per group)."""
    if row_group_size < 1:
        raise ValueError(f"row_group_size: must be >= 1, got {row_group_size}")
    path = Path(path)
    table = pa.table({TEXT_COLUMN: pa.array(list(texts), type=pa.string())})
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------------------------
# reading
@dataclass(frozen=True)
class RowGroup:
    """One row group of one shard: the unit a rank reads."""

    path: Path
    shard: int  # shard index parsed from the file name
    row_group: int  # row-group index inside the shard
    num_rows: int

    def read(self) -> list[str]:
        return read_row_group(self.path, self.row_group)


def list_shards(data_dir: str | os.PathLike) -> list[Path]:
    """All complete ``shard_NNNNN.parquet`` files in ``data_dir``, by index (``.part`` files are
    ignored)."""
    d = Path(data_dir).expanduser()
    if not d.is_dir():
        raise ValueError(f"data_dir: {d} is not a directory")
    return sorted((p for p in d.iterdir() if SHARD_RE.match(p.name)), key=lambda p: p.name)


def split_shards(shards: Sequence[str | os.PathLike], split: str) -> list[Path]:
    """The last shard (by file name) is ``val``; all others are ``train``."""
    if split not in SPLITS:
        raise ValueError(f"split: must be one of {SPLITS}, got {split!r}")
    paths = sorted((Path(s) for s in shards), key=lambda p: p.name)
    if not paths:
        raise ValueError("shards: no shard files given")
    if split == "val":
        return paths[-1:]
    if len(paths) < 2:
        raise ValueError(
            f"shards: need >= 2 shards for a train split (the last is val), got {len(paths)}"
        )
    return paths[:-1]


def resolve_shards(
    source: str | os.PathLike | Sequence[str | os.PathLike], split: str
) -> list[Path]:
    """Shards of ``split`` from a data directory, or from an explicit list of shard files."""
    if isinstance(source, (str, os.PathLike)):
        shards = list_shards(source)
        if not shards:
            raise ValueError(f"data_dir: {source} holds no shard_NNNNN.parquet files")
    else:
        shards = [Path(s) for s in source]
        missing = [s for s in shards if not s.is_file()]
        if missing:
            raise ValueError(f"shards: {missing[0]} does not exist")
    return split_shards(shards, split)


def row_groups(shards: Sequence[Path]) -> list[RowGroup]:
    """All row groups of ``shards`` in order (shard, then row group). Reads only parquet footers."""
    out = []
    for path in shards:
        m = SHARD_RE.match(path.name)
        index = int(m.group(1)) if m else -1
        meta = pq.ParquetFile(path).metadata
        if TEXT_COLUMN not in meta.schema.names:
            raise ValueError(
                f"shards: {path} has no {TEXT_COLUMN!r} column (columns: {meta.schema.names})"
            )
        out.extend(
            RowGroup(path, index, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)
        )
    return out


def read_row_group(path: str | os.PathLike, row_group: int) -> list[str]:
    pf = pq.ParquetFile(path)
    return pf.read_row_group(row_group, columns=[TEXT_COLUMN]).column(TEXT_COLUMN).to_pylist()


def iter_documents(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    split: str = "train",
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[str]:
    """Documents of ``split``, one pass; rank ``r`` reads row groups ``r, r+world_size, ...`` across
    shards."""
    check_rank(rank, world_size)
    for rg in row_groups(resolve_shards(source, split))[rank::world_size]:
        yield from rg.read()


def text_iterator(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    split: str = "train",
    max_chars: int | None = None,
) -> Iterator[str]:
    """Documents for tokenizer training, stopping after about ``max_chars`` characters."""
    total = 0
    for doc in iter_documents(source, split):
        yield doc
        total += len(doc)
        if max_chars is not None and total >= max_chars:
            return


def check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size: must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: must be in [0, world_size={world_size}), got {rank}")


# ----------------------------------------------------------------------------------------------
# downloading
class PermanentDownloadError(RuntimeError):
    """A failure that retrying cannot fix (404, 403, ...)."""


Opener = Callable[..., Any]  # urllib.request.urlopen-like: (Request, timeout=) -> response


def _open(url: str, offset: int, timeout: float, opener: Opener):
    req = urllib.request.Request(url, headers={"User-Agent": "lrt_lab-scale/0.1"})
    if offset:
        req.add_header("Range", f"bytes={offset}-")
    return opener(req, timeout=timeout)


def _looks_like_parquet(path: Path) -> bool:
    size = path.stat().st_size
    if size < 8:
        return False
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(size - 4)
        return head == _PARQUET_MAGIC and f.read(4) == _PARQUET_MAGIC


def download_file(
    url: str,
    dest: str | os.PathLike,
    *,
    retries: int = 5,
    backoff: float = 2.0,
    timeout: float = 60.0,
    opener: Opener = urllib.request.urlopen,
    sleep: Callable[[float], None] = time.sleep,
    check_parquet: bool = True,
) -> Path:
    """Fetch ``url`` to ``dest`` via ``dest.part``; resume, retry, verify, then rename atomically.

    ``retries`` is the number of *extra* attempts after the first; attempt ``k`` waits ``backoff *
    2**k`` seconds (capped at 5 minutes). HTTP 4xx other than 408/429 fails at once (retrying cannot
    fix it). ``opener`` and ``sleep`` are injectable for tests.
    """
    if retries < 0:
        raise ValueError(f"retries: must be >= 0, got {retries}")
    dest = Path(dest)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    last_err: BaseException | None = None
    for attempt in range(retries + 1):
        if attempt:
            sleep(min(backoff * 2 ** (attempt - 1), 300.0))
        offset = part.stat().st_size if part.exists() else 0
        try:
            with _open(url, offset, timeout, opener) as resp:
                status = getattr(resp, "status", None) or 200  # file:// responses carry no status
                if offset and status != 206:  # server ignored the Range header: start over
                    offset = 0
                length = resp.headers.get("Content-Length") if resp.headers else None
                expected = offset + int(length) if length is not None else None
                with open(part, "ab" if offset else "wb") as f:
                    while chunk := resp.read(_CHUNK):
                        f.write(chunk)
            got = part.stat().st_size
            if expected is not None and got < expected:
                raise ConnectionError(f"incomplete read: {got} of {expected} bytes")
            if check_parquet and not _looks_like_parquet(part):
                part.unlink()
                raise ConnectionError(
                    "downloaded file is not a whole parquet file (bad magic bytes)"
                )
            os.replace(part, dest)
            return dest
        except urllib.error.HTTPError as e:
            if e.code == 416:  # our .part is longer than the file: discard it and start over
                part.unlink(missing_ok=True)
            elif 400 <= e.code < 500 and e.code not in (408, 429):
                raise PermanentDownloadError(f"{url}: HTTP {e.code} {e.reason}") from e
            last_err = e
        except (
            urllib.error.URLError,
            http.client.HTTPException,
            OSError,
        ) as e:  # incl. timeouts, resets
            last_err = e
        print(
            f"download {url}: attempt {attempt + 1}/{retries + 1} failed: {last_err}",
            file=sys.stderr,
        )
    raise RuntimeError(f"{url}: giving up after {retries + 1} attempts") from last_err


def shards_to_download(
    num_shards: int, total_shards: int = NUM_SHARDS, include_val: bool = True
) -> list[int]:
    """The first ``num_shards`` train shards, plus the release's last shard (validation)."""
    if total_shards < 2:
        raise ValueError(f"total_shards: must be >= 2, got {total_shards}")
    if not 0 <= num_shards <= total_shards - 1:
        raise ValueError(
            f"num_shards: must be in [0, {total_shards - 1}] (the last shard is val), got "
            f"{num_shards}"
        )
    ids = list(range(num_shards))
    if include_val:
        ids.append(total_shards - 1)
    return ids


def download_shards(
    num_shards: int,
    data_dir: str | os.PathLike = DEFAULT_DATA_DIR,
    *,
    base_url: str = BASE_URL,
    total_shards: int = NUM_SHARDS,
    include_val: bool = True,
    workers: int = 4,
    **kwargs,
) -> list[Path]:
    """Download shards in parallel threads; finished shards are skipped. ``kwargs`` go to
    :func:`download_file`."""
    if workers < 1:
        raise ValueError(f"workers: must be >= 1, got {workers}")
    d = Path(data_dir).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    ids = shards_to_download(num_shards, total_shards, include_val)

    def one(i: int) -> Path:
        return download_file(shard_url(i, base_url), d / shard_name(i), **kwargs)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, ids))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lrt_scale.data", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    dl = sub.add_parser("download", help="download N train shards plus the validation shard")
    dl.add_argument(
        "--shards",
        type=int,
        required=True,
        help="number of train shards (each about 100 MB of compressed text)",
    )
    dl.add_argument(
        "--dir", default=str(DEFAULT_DATA_DIR), help="data directory (default: %(default)s)"
    )
    dl.add_argument("--workers", type=int, default=4)
    dl.add_argument("--retries", type=int, default=5)
    dl.add_argument("--base-url", default=BASE_URL)
    dl.add_argument("--no-val", action="store_true", help="do not fetch the validation shard")
    info = sub.add_parser("info", help="list the local shards and their split")
    info.add_argument("--dir", default=str(DEFAULT_DATA_DIR))
    args = ap.parse_args(argv)
    if args.cmd == "download":
        paths = download_shards(
            args.shards,
            args.dir,
            base_url=args.base_url,
            include_val=not args.no_val,
            workers=args.workers,
            retries=args.retries,
        )
        print(f"{len(paths)} shards in {args.dir}")
    else:
        shards = list_shards(args.dir)
        for split in SPLITS:
            try:
                rgs = row_groups(split_shards(shards, split))
            except ValueError as e:
                print(f"{split}: {e}")
                continue
            print(
                f"{split}: {len({r.path for r in rgs})} shards, {len(rgs)} row groups, "
                f"{sum(r.num_rows for r in rgs)} documents"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
