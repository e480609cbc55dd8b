"""The run store: one folder per run, written atomically, read back as pandas tables.

    runs/<name>/config.json     everything needed to rerun it (train config, model config, params)
    runs/<name>/metrics.jsonl   one JSON object per logged step ({"step", "kind": "train"|"eval",
    ...}); once the run is complete, metrics.jsonl.xz instead (below)
    runs/<name>/summary.json    final figures; present only once the run completed
    runs/<name>/tables/*.csv    tables (per-position accuracy, analysis outputs)
    runs/<name>/checkpoints/    step_XXXXXXX.pt, for --resume

Every file is written to a temporary name and renamed (os.replace is atomic on POSIX), and a new
run folder is assembled under a hidden name and renamed into place, so a killed process never
leaves a half-written file. metrics.jsonl is the one append-only file: its last line may be cut
by a kill; readers drop such a line and report it. Temporary files of a killed writer are
removed when the run is resumed (`Run.remove_temp_files`).

A complete run's per-step log is stored compressed: `Run.write_summary` compacts metrics.jsonl
into metrics.jsonl.xz (`compact_metrics`; `lrt-lab store compact` does it for a whole store).
The .xz is one xz stream (stdlib lzma, LZMA2 at preset 9 extreme tuned for text, a dictionary as
large as the log) whose decompressed bytes are exactly those of the metrics.jsonl it replaces,
and the same log always gives the same file, so a store under version control changes only
where a log did; `xz -dc metrics.jsonl.xz` reads it anywhere. Compacting writes the .xz under a
temporary name, renames it into place and only then removes metrics.jsonl; writing to a
compacted run (resume, `Run.log`, `replace_metrics`) first puts metrics.jsonl back the same way
and then removes the .xz. A kill at any point therefore leaves the log whole in at least one of
the two files, and when both are there metrics.jsonl is the one read: every step either copies
it (both then hold the same bytes) or writes it after the .xz was made. `metrics_file` names the
file a run's log is read from; every reader of the log goes through it.

Damage never spreads: a file that is not what it should be (bytes that are not UTF-8, bad or
too deeply nested JSON, a directory in its place, a field of the wrong type such as a list for
summary "eval" or a string "final_loss") raises `DamagedFileError` (a ValueError) from the Run
accessors, and the store readers skip it and report it: `load_runs` skips the run (listed in
`df.attrs["skipped"]` with the reason, and warned), `load_metrics` drops unreadable lines
(counted in `df.attrs["dropped_lines"]`) or returns an empty table for an unreadable file
(`df.attrs["damaged"]`), `load_table` returns None for a damaged CSV. The other runs read as before.

`load_runs(root)` -> DataFrame, one row per run (config and summary flattened with dotted
column names); folders that are not readable runs are skipped and listed in `df.attrs["skipped"]`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import lzma
import math
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from lrt_lab.core.config import MemoryConfig, ModelConfig, with_legacy_fields
from lrt_lab.core.validation import field_defaults
from lrt_lab.store.claims import Claim, acquire

if TYPE_CHECKING:  # pandas is imported where a table is built: a sweep's checks need none
    import pandas as pd

CONFIG, METRICS, SUMMARY, TABLES, CHECKPOINTS = (
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "tables",
    "checkpoints",
)
METRICS_XZ = METRICS + ".xz"  # a complete run's metrics.jsonl, compressed (compact_metrics)


def _clean(obj):
    """JSON-safe: NaN/inf become None (JSON has no NaN), tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def respect_umask(path, directory: bool = False) -> None:
    """Give a file or folder made by tempfile (0600 / 0700 whatever the umask) the permissions a
    plain open / mkdir would have: a store shared by a group stays readable by it."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def write_json(path: Path, obj) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    respect_umask(tmp)
    with os.fdopen(fd, "w") as f:
        json.dump(_clean(obj), f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_table(run_dir: Path, name: str, df: pd.DataFrame) -> Path:
    """Atomically write tables/<name>.csv inside a run folder."""
    tables = Path(run_dir) / TABLES
    tables.mkdir(exist_ok=True)
    path = tables / f"{name}.csv"
    fd, tmp = tempfile.mkstemp(dir=tables, prefix=f".{name}.", suffix=".tmp")
    respect_umask(tmp)
    with os.fdopen(fd, "w") as f:
        df.to_csv(f, index=False)
    os.replace(tmp, path)
    return path


class DamagedFileError(ValueError):
    """A run-store file that exists but cannot be read as what it should be (bad bytes, bad JSON,
    a directory in its place, the wrong shape). Readers of the store skip it and report it."""


# The fields readers use, with the JSON types they must have when present (None: JSON null, for
# NaN/inf written by _clean). Unknown fields are kept as they are.
_NUMBER = (int, float, type(None))
CONFIG_SCHEMA = {
    "train": dict,
    "model": dict,
    "params": dict,
    "kind": str,
    "schedule": str,
    "schedule_cost": _NUMBER,
    "forwards_per_token": _NUMBER,
    "task_vocab_size": _NUMBER,
}
SUMMARY_SCHEMA = {
    "status": str,
    "steps": _NUMBER,
    "final_loss": _NUMBER,
    "wall_time_s": _NUMBER,
    "tokens": _NUMBER,
    "compute_tokens": _NUMBER,
    "schedule_cost": _NUMBER,
    "forwards_per_token": _NUMBER,
    "eval": dict,
}
# A metrics record: the fields the training-curve readers plot (step is an integer, see
# _read_jsonl).
METRICS_SCHEMA = {
    "step": (int,),
    "kind": str,
    "loss": _NUMBER,
    "tokens": _NUMBER,
    "compute_tokens": _NUMBER,
    "time": _NUMBER,
    "lr_mult": _NUMBER,
    "length": _NUMBER,
    "tokens_per_s": _NUMBER,
    "stage_losses": list,
}
MAX_DEPTH = 8  # deeper JSON is not something this library writes


def _depth(obj, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a JSON value, counted iteratively (a deep value must not blow the stack)."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        value, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            break
        if isinstance(value, dict):
            stack.extend((v, d + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, d + 1) for v in value)
    return deepest


# An integer beyond float64 (10^308) is nothing this library writes, and no reader can use it (a
# float of it overflows); one of over 4300 digits Python does not even convert.
MAX_INT_DIGITS = 308
_LONG_DIGITS = re.compile(rb"\d{%d}" % (MAX_INT_DIGITS + 1))


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _parse_json(data: bytes, what: str):
    """JSON from bytes; DamagedFileError for bytes that are not UTF-8 JSON of sane depth and of
    integers a float holds."""
    # the hook costs a call per integer: only where a long run of digits is there at all
    parse_int = _bounded_int if _LONG_DIGITS.search(data) else None
    try:
        obj = json.loads(data.decode("utf-8"), parse_int=parse_int)
    except UnicodeDecodeError as e:
        raise DamagedFileError(f"{what}: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise DamagedFileError(f"{what}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise DamagedFileError(f"{what}: JSON nested too deeply") from None
    except ValueError as e:  # _bounded_int's
        raise DamagedFileError(f"{what}: a number too long to read ({e})") from None
    # depth <= the number of brackets: most values (a metrics line) need no walk
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH and _depth(obj) > MAX_DEPTH:
        raise DamagedFileError(f"{what}: JSON nested deeper than {MAX_DEPTH} levels")
    return obj


def _bad_type(obj: dict, schema: dict) -> str | None:
    for key, types in schema.items():
        value = obj.get(key)
        if key in obj and (
            not isinstance(value, types)
            or isinstance(value, bool)
            and bool not in (types if isinstance(types, tuple) else (types,))
        ):
            return f"{key!r} is {type(value).__name__}"
    return None


PLANS = ".plans"  # in a store: what each sweep that wrote to it planned (load_plans)


def write_plan(root, runs: list[str], seeds: list[int]) -> Path:
    """Record in the store what a sweep plans: its runs' names and its seeds. A plan is named by
    its runs, so running the same grid again rewrites the same file, and a grid that plans more
    seeds adds a new one. What reads a partly run grid (a decision that waits for every planned
    seed: lrt_results.scaling.planned_seeds) learns from it what is still to come."""
    folder = Path(root) / PLANS
    folder.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha1("\n".join(sorted(runs)).encode()).hexdigest()[:12]
    path = folder / f"plan-{key}.json"
    write_json(path, {"runs": sorted(runs), "seeds": sorted(seeds)})
    return path


def load_plans(root) -> list[dict]:
    """The plans recorded in a store ({"runs": [...], "seeds": [...]}, write_plan); a damaged
    plan file is skipped with a warning naming it."""
    plans = []
    for path in sorted((Path(root) / PLANS).glob("plan-*.json")):
        try:
            plan = read_json(path, {"runs": list, "seeds": list})
            if not isinstance(plan, dict) or {"runs", "seeds"} - plan.keys():
                raise DamagedFileError(f"{path.name}: not a plan (no runs and seeds)")
        except DamagedFileError as e:
            warnings.warn(f"{PLANS}/{e}: skipped", stacklevel=2)
            continue
        plans.append(plan)
    return plans


def read_json(path: Path, schema: dict | None = None):
    """A JSON file; with `schema`, an object whose listed fields have the listed types.

    DamagedFileError (a ValueError) names the file and what is wrong with it.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:  # a directory in its place, unreadable
        raise DamagedFileError(
            f"{path.name}: unreadable ({e.strerror or type(e).__name__})"
        ) from None
    obj = _parse_json(data, path.name)
    if schema is not None:
        if not isinstance(obj, dict):
            raise DamagedFileError(f"{path.name}: not a JSON object but {type(obj).__name__}")
        bad = _bad_type(obj, schema)
        if bad:
            raise DamagedFileError(f"{path.name}: {bad}")
        if path.name == SUMMARY:
            ev = obj.get("eval", {})
            odd = [k for k, v in ev.items() if not isinstance(v, (int, float, str, type(None)))]
            if odd:
                raise DamagedFileError(
                    f"{path.name}: eval[{odd[0]!r}] is {type(ev[odd[0]]).__name__}, not a number"
                )
    return obj


class Run:
    """A run folder. Create with Run.create (atomic) or open an existing one with Run(path)."""

    def __init__(self, path):
        self.path = Path(path)

    @property
    def name(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, root, name: str, config: dict) -> Run:
        """Make root/name with config.json in one atomic rename; fails if it already exists."""
        run, claim = cls._assemble(root, name, config, claimed=False)
        return run

    @classmethod
    def create_claimed(cls, root, name: str, config: dict) -> tuple[Run, Claim]:
        """Run.create with this process's claim inside the folder before it appears (one writer
        per run, `lrt_lab.store.claims`): (the run, the claim to release when done)."""
        return cls._assemble(root, name, config, claimed=True)

    @classmethod
    def _assemble(cls, root, name: str, config: dict, claimed: bool):
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        final = root / name
        if final.exists():
            raise FileExistsError(_exists_message(final, config))
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
        claim = None
        try:
            respect_umask(tmp, directory=True)
            if claimed:
                claim = acquire(tmp)
            write_json(tmp / CONFIG, config)
            (tmp / METRICS).touch()
            try:
                os.rename(tmp, final)  # fails when another process made `final` meanwhile
            except OSError as e:
                if final.exists():
                    raise FileExistsError(
                        f"run folder {final} already exists (made by another process just now)"
                    ) from None
                raise e
        except BaseException:
            if claim is not None:
                claim.release()
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls(final), (claim.moved_to(final) if claim is not None else None)

    @property
    def config(self) -> dict:
        """config.json; DamagedFileError (a ValueError) when it is damaged."""
        return read_json(self.path / CONFIG, CONFIG_SCHEMA)

    @property
    def summary(self) -> dict | None:
        """summary.json, None while the run is incomplete; DamagedFileError when it is damaged."""
        p = self.path / SUMMARY
        return read_json(p, SUMMARY_SCHEMA) if p.exists() else None

    @property
    def is_complete(self) -> bool:
        return (self.path / SUMMARY).exists()

    def log(self, record: dict) -> None:
        """Append one metrics record (one line, flushed), so a kill loses at most that line. A
        compacted log is expanded back to metrics.jsonl first."""
        line = json.dumps(_clean(record), sort_keys=True)
        self.expand_metrics()
        with open(self.path / METRICS, "a") as f:
            f.write(line + "\n")
            f.flush()

    def metrics_records(self, kind: str | None = None) -> list[dict]:
        """The log's records (of one `kind`, "train" or "eval", when given: read_metrics)."""
        records, _ = read_metrics(self.path, kind)
        return records

    def truncate_metrics(self, last_step: int) -> None:
        """Keep only records with step <= last_step (resume from a checkpoint at last_step)."""
        self.replace_metrics([r for r in self.metrics_records() if r.get("step", -1) <= last_step])

    def replace_metrics(self, records: list[dict]) -> None:
        """Write metrics.jsonl anew with `records`, atomically (a kill leaves the old file); a
        compacted log's .xz is removed once the new file is in place (it is read first)."""
        text = "".join(json.dumps(_clean(r), sort_keys=True) + "\n" for r in records)
        _write_atomically(self.path / METRICS, text.encode())
        (self.path / METRICS_XZ).unlink(missing_ok=True)

    @property
    def metrics_path(self) -> Path:
        """The file the run's log is read from (`metrics_file`): metrics.jsonl, or the .xz of a
        compacted run; metrics.jsonl where there is neither yet."""
        return metrics_file(self.path) or self.path / METRICS

    @property
    def is_compacted(self) -> bool:
        """True when the log is held by metrics.jsonl.xz alone."""
        return metrics_file(self.path) == self.path / METRICS_XZ

    def metrics_bytes(self) -> bytes:
        """The log's bytes as metrics.jsonl held them (decompressed from the .xz of a compacted
        run); b"" when there is no log. DamagedFileError when the file cannot be read."""
        return _read_metrics_bytes(self.path)[0]

    def compact_metrics(self) -> tuple[int, int] | None:
        """Replace metrics.jsonl by metrics.jsonl.xz holding the same bytes (see the module's
        docstring for the order that makes a kill harmless); (bytes before, bytes after), None
        when there is no metrics.jsonl (compacted already, or no log). Only for a run no other
        process writes: the training process at its end, or `lrt-lab store compact` under the
        run's claim."""
        plain = self.path / METRICS
        if not plain.is_file():
            return None
        data = plain.read_bytes()
        packed = compress_metrics(data)
        _write_atomically(self.path / METRICS_XZ, packed, like=plain)
        plain.unlink()
        return len(data), len(packed)

    def expand_metrics(self) -> bool:
        """Put a compacted log back into metrics.jsonl (before appending to it), then remove
        the .xz; False when there was nothing to expand."""
        packed, plain = self.path / METRICS_XZ, self.path / METRICS
        if not packed.exists():
            return False  # the common case costs one stat: no .xz
        if plain.exists():  # a kill cut a compaction or expansion short: the plain log is read
            packed.unlink()
            return False
        data, complete = _decompress(packed.read_bytes(), packed.name)
        if not complete:
            raise DamagedFileError(f"{packed.name}: cut short; cannot append to it")
        _write_atomically(plain, data, like=packed)
        packed.unlink()
        return True

    def write_summary(self, summary: dict) -> None:
        """summary.json (the run is complete), then the log compacted (compact_metrics)."""
        write_json(self.path / SUMMARY, summary)
        self.compact_metrics()

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        return write_table(self.path, name, df)

    def tables(self) -> dict[str, Path]:
        d = self.path / TABLES
        return {p.stem: p for p in sorted(d.glob("*.csv"))} if d.exists() else {}

    def checkpoint_dir(self) -> Path:
        d = self.path / CHECKPOINTS
        d.mkdir(exist_ok=True)
        return d

    @property
    def status(self) -> str:
        """ "complete", "diverged" (summary.json written with that status), or "incomplete"."""
        summary = self.summary
        return "incomplete" if summary is None else summary.get("status", "complete")

    def checkpoints(self) -> list[Path]:
        """The run's checkpoint files, oldest first."""
        d = self.path / CHECKPOINTS
        return sorted(p for p in d.glob("step_*.pt") if p.is_file()) if d.is_dir() else []

    def latest_checkpoint(self) -> Path | None:
        ckpts = self.checkpoints()
        return ckpts[-1] if ckpts else None

    def remove_temp_files(self) -> list[Path]:
        """Delete the temporary files a killed writer leaves (`.*.tmp`: checkpoints, JSON, tables,
        metrics rewrites); the files they were meant to replace are untouched. Call only while no
        other process writes this run (resume does)."""
        removed = []
        for d in (self.path, self.path / CHECKPOINTS, self.path / TABLES):
            if d.is_dir():
                for p in d.glob(".*.tmp"):
                    if p.is_file():
                        p.unlink(missing_ok=True)
                        removed.append(p)
        return removed


def diverged_line(name: str, summary: dict) -> str:
    """The one line that says a run diverged and what to do, from its summary.json."""
    step, loss = summary.get("diverged_at_step", "?"), summary.get("diverged_loss", "?")
    return (
        f"{name}: diverged at step {step} (loss {loss}); summary.json status 'diverged'. "
        "Lower --lr-scale (or the learning rates) and train it under a new name"
    )


def first_names(names: list[str], most: int = 3) -> str:
    """`a, b, c ...`: the first `most` run names of a list, for a one-line message."""
    return ", ".join(names[:most]) + (" ..." if len(names) > most else "")


_parsed: dict | None = None  # (path, kind) -> (stat key, records, dropped), in reading_once()


@contextlib.contextmanager
def reading_once():
    """Within it, each log file is parsed once while its size and modification time stay
    the same, however many tables read it (a study's report reads every run's file for each
    metric, arm and figure). Each reader gets its own list of the same records: no reader of
    the store changes a record it was given."""
    global _parsed
    outer = _parsed
    _parsed = {} if outer is None else outer
    try:
        yield
    finally:
        _parsed = outer


def metrics_file(run_dir) -> Path | None:
    """The file a run folder's log is read from: metrics.jsonl while it is there (a run in
    progress, or one whose compaction or expansion a kill cut short: the module's docstring says
    why it is then the one to read), else metrics.jsonl.xz; None when there is neither."""
    plain = Path(run_dir) / METRICS
    if os.path.lexists(plain):  # a directory in its place too: read, and reported as damaged
        return plain
    packed = plain.with_name(METRICS_XZ)
    return packed if os.path.lexists(packed) else None


def read_metrics(run_dir, kind: str | None = None) -> tuple[list[dict], int]:
    """(records, dropped lines) of a run folder's log, metrics.jsonl or metrics.jsonl.xz alike
    (`_read_jsonl`); ([], 0) when it has none. With `kind`, only the records of that kind, and
    the dropped lines among those that may be of it (`_parse_jsonl`)."""
    for _ in range(3):  # compacted or expanded by its writer between choosing and reading: again
        path = metrics_file(run_dir)
        if path is None:
            return [], 0
        try:
            return _read_jsonl(path, kind)
        except FileNotFoundError:
            continue
    raise DamagedFileError(f"{METRICS}: moved while read three times over; read it again")


def _read_jsonl(path: Path, kind: str | None = None) -> tuple[list[dict], int]:
    """(records, dropped lines) of a metrics.jsonl or metrics.jsonl.xz. A line is dropped (and
    counted) unless it is UTF-8 JSON of sane depth holding an object whose known fields have
    their types (METRICS_SCHEMA): a line cut by a kill, stray bytes, a foreign record; an .xz
    cut short counts one more. A file that cannot be read at all (a directory in its place, an
    .xz that is not one) raises DamagedFileError. Within reading_once the records are kept by the
    path of the file read, the kind asked for, its size, modification time and inode."""
    path = Path(path)
    if _parsed is None or not path.is_file():
        return _parse_jsonl(path, kind)
    st = path.stat()
    key = (st.st_size, st.st_mtime_ns, st.st_ino)
    if _parsed.get((str(path), kind), (None,))[0] != key:
        every = _parsed.get((str(path), None), (None,))
        if kind is not None and every[0] == key:  # every record is parsed already: filter those
            kept = [r for r in every[1] if r.get("kind") == kind]
            _parsed[(str(path), kind)] = (key, kept, _parse_jsonl(path, kind)[1] if every[2] else 0)
        else:
            _parsed[(str(path), kind)] = (key, *_parse_jsonl(path, kind))
    _, records, bad = _parsed[(str(path), kind)]
    return list(records), bad


# LZMA2 at its strongest: literal context 4 and no position bits suit text (a JSON log, whose
# bytes have no alignment), about 1% smaller than plain preset 9; the dictionary is made just
# large enough for the log (a larger one compresses no better and costs memory on both sides).
_XZ_DICT_MIN, _XZ_DICT_MAX = 1 << 16, 1 << 26


def compress_metrics(data: bytes) -> bytes:
    """The .xz of a metrics.jsonl's bytes; the same bytes always give the same file."""
    dict_size = _XZ_DICT_MIN
    while dict_size < min(len(data), _XZ_DICT_MAX):
        dict_size *= 2
    lzma2 = {
        "id": lzma.FILTER_LZMA2,
        "preset": 9 | lzma.PRESET_EXTREME,
        "dict_size": dict_size,
        "lc": 4,
        "lp": 0,
        "pb": 0,
        "nice_len": 273,
    }
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, filters=[lzma2])


def _decompress(packed: bytes, name: str) -> tuple[bytes, bool]:
    """(the bytes an .xz holds, whether it was whole): a file cut short gives what it holds up
    to the cut, bytes that are not xz raise DamagedFileError."""
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        data = decompressor.decompress(packed)
    except lzma.LZMAError as e:
        raise DamagedFileError(f"{name}: not a readable xz file ({e})") from None
    return data, decompressor.eof


def _read_metrics_bytes(run_dir) -> tuple[bytes, bool]:
    """(the bytes of a run's log as metrics.jsonl held them, whether they are whole)."""
    for _ in range(3):  # as read_metrics: the writer may swap the files between stat and read
        path = metrics_file(run_dir)
        if path is None:
            return b"", True
        try:
            return _file_bytes(path)
        except FileNotFoundError:
            continue
    raise DamagedFileError(f"{METRICS}: moved while read three times over; read it again")


def _file_bytes(path: Path) -> tuple[bytes, bool]:
    """(bytes, whole) of a metrics.jsonl or, decompressed, a metrics.jsonl.xz; FileNotFoundError
    passes (the file was swapped meanwhile), other failures raise DamagedFileError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise DamagedFileError(
            f"{path.name}: unreadable ({e.strerror or type(e).__name__})"
        ) from None
    return _decompress(data, path.name) if path.name.endswith(".xz") else (data, True)


def _write_atomically(path: Path, data: bytes, like: Path | None = None) -> None:
    """`data` into `path` under a temporary name, synced and renamed into place; with the
    permissions of `like` (the file it stands for) where that exists, else the umask's."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, os.stat(like).st_mode & 0o777) if like else respect_umask(tmp)
        except OSError:
            respect_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _parse_jsonl(path: Path, kind: str | None = None) -> tuple[list[dict], int]:
    """(records, dropped lines). With `kind`, a line that names another kind the way this
    library writes it (`"kind": "train"`, sorted keys) is passed over unparsed: a run's log is
    mostly training lines, and the evaluations that most readers want are one in hundreds. A
    line that does not name its kind so is parsed and, if whole, filtered by its field."""
    records, bad = [], 0
    data, whole = _file_bytes(path)  # FileNotFoundError passes: read_metrics looks again
    bad += not whole  # the rest of an .xz cut short: unreadable, counted once
    wanted = None if kind is None else b'"kind": ' + json.dumps(kind).encode()
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        if wanted is not None and wanted not in line and b'"kind": "' in line:
            continue
        try:
            rec = _parse_json(line, path.name)
        except DamagedFileError:
            bad += 1
            continue
        if not isinstance(rec, dict) or _bad_type(rec, METRICS_SCHEMA):
            bad += 1
            continue
        if kind is None or rec.get("kind") == kind:
            records.append(rec)
    return records, bad


def _exists_message(folder: Path, config: dict) -> str:
    """Why a new run cannot take `folder`: the same arguments (continue it with --resume), or
    other ones under the same name (name this run another way with --name)."""
    try:
        stored = flatten_dict(json.loads((folder / CONFIG).read_text()))
    except (OSError, ValueError):
        return f"run folder {folder} already exists (use --resume to continue it)"
    new = flatten_dict(json.loads(json.dumps(config)))
    differ = sorted(k for k in stored.keys() | new.keys() if stored.get(k) != new.get(k))
    if not differ:
        return f"run folder {folder} already exists (use --resume to continue it)"
    shown = ", ".join(differ[:3]) + (" ..." if len(differ) > 3 else "")
    return (
        f"run folder {folder} already exists with other arguments ({shown} differ): give "
        "this run another name with --name, or pass the folder's own arguments to --resume it"
    )


def with_current_defaults(config: dict) -> dict:
    """A stored run config with today's defaults filled in for the model and memory fields it
    predates (a run written before `memory.update` existed built what update="overwrite" builds),
    so runs that differ only by when they were written group together everywhere (report,
    dashboard, results tables). A field whose default changed the model (`LEGACY_FIELDS`) reads
    as the value the run ran under instead, so runs of two conventions never group together. The
    config is copied, the file untouched."""
    model = config.get("model")
    if not isinstance(model, dict):
        return config
    model = {**field_defaults(ModelConfig, skip=("memory",)), **with_legacy_fields(model)}
    if isinstance(model.get("memory"), dict):
        model["memory"] = {**field_defaults(MemoryConfig), **model["memory"]}
    return {**config, "model": model}


def flatten_dict(d: dict, prefix: str = "") -> dict:
    """A nested dict as one level with dotted keys, each under `prefix`: {"train": {"seed": 0}}
    with prefix "config." gives {"config.train.seed": 0}. A list becomes its JSON text, so every
    value fits one DataFrame cell. load_runs names its config./summary. columns so, and load_metrics
    a record's nested fields."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_dict(v, key + "."))
        elif isinstance(v, list):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def load_runs(root, include_incomplete: bool = False) -> pd.DataFrame:
    """One row per run under root: `run`, `path`, `status`, then config.* and summary.* columns.

    Folders that cannot be read as runs (no or corrupt config.json, e.g. a half-written folder)
    are skipped with a warning and listed in df.attrs["skipped"] as (folder, reason). Runs without
    a summary (still training, or killed) are skipped too unless include_incomplete=True.
    """
    import pandas as pd

    root = Path(root)
    rows, skipped = [], []
    if root.is_dir():
        for d in sorted(p for p in root.iterdir() if not p.name.startswith(".") and _is_dir(p)):
            cfg_path = d / CONFIG
            try:
                if not cfg_path.exists():
                    skipped.append((d.name, "no config.json (not a run folder, or half-written)"))
                    continue
                run = Run(d)
                config, summary = run.config, run.summary
            except DamagedFileError as e:
                skipped.append((d.name, f"damaged: {e}"))
                continue
            except OSError as e:  # a folder this user cannot read (another user's run, lost+found)
                skipped.append((d.name, f"unreadable: {e.strerror or type(e).__name__}"))
                continue
            if summary is None and not include_incomplete:
                skipped.append(
                    (d.name, "incomplete: no summary.json (running, or killed; --resume it)")
                )
                continue
            status = "incomplete" if summary is None else summary.get("status", "complete")
            row = {"run": d.name, "path": str(d), "status": status}
            row.update(flatten_dict(with_current_defaults(config), "config."))
            row.update(flatten_dict(summary or {}, "summary."))
            rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["skipped"] = skipped
    for name, reason in skipped:
        if not reason.startswith("incomplete"):
            warnings.warn(f"skipped run folder {name!r}: {reason}", stacklevel=2)
    return df


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except OSError:
        return True  # cannot even stat it: listed, then skipped with the reason


def load_metrics(run, kind: str | None = None) -> pd.DataFrame:
    """A run's log (metrics.jsonl, or its .xz) as a DataFrame (nested fields flattened); `kind`
    filters records.

    `run` is a run folder path, a Run, or a row of load_runs. A last line cut by a kill is
    dropped and counted in df.attrs["dropped_lines"].
    """
    import pandas as pd

    if isinstance(run, Run):
        path = run.path
    elif isinstance(run, pd.Series):
        path = Path(run["path"])
    else:
        path = Path(run)
    try:
        records, bad = read_metrics(path, kind)
        damaged = None
    except DamagedFileError as e:
        records, bad, damaged = [], 0, str(e)
        warnings.warn(f"run {path.name!r}: {damaged}; no metrics read", stacklevel=2)
    if bad:
        warnings.warn(
            f"run {path.name!r}: {bad} unreadable line(s) of {METRICS} dropped", stacklevel=2
        )
    df = pd.DataFrame([flatten_dict(r) for r in records])
    df.attrs["dropped_lines"] = bad
    df.attrs["damaged"] = damaged
    return df


def evaluations(rows: pd.DataFrame, metric: str, x: str = "step") -> pd.DataFrame:
    """Every evaluation of the runs of `rows` (load_runs rows) that measured `metric` and `x`:
    columns row (the run's index label in rows), run, step, x, value; empty when none did."""
    import pandas as pd

    parts = []
    for label, row in rows.iterrows():
        evals = load_metrics(row, kind="eval")
        if not {"step", x, metric} <= set(evals.columns):
            continue
        part = pd.DataFrame({"step": evals["step"], "x": evals[x], "value": evals[metric]})
        parts.append(part.dropna().assign(row=label, run=row["run"]))
    columns = ["row", "run", "step", "x", "value"]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)


def load_table(run, name: str) -> pd.DataFrame | None:
    """tables/<name>.csv of a run, or None when the run has no such table."""
    import pandas as pd

    path = (
        Path(run["path"] if isinstance(run, pd.Series) else getattr(run, "path", run))
        / TABLES
        / f"{name}.csv"
    )
    if not path.exists():
        return None
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        warnings.warn(f"table {path} is damaged ({type(e).__name__}); skipped", stacklevel=2)
        return None
