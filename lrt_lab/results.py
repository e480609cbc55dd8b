"""The run store: one folder per run, written atomically, read back as pandas tables.

    runs/<name>/config.json     everything needed to rerun it (train config, model config, params)
    runs/<name>/metrics.jsonl   one JSON object per logged step ({"step", "kind": "train"|"eval", ...})
    runs/<name>/summary.json    final figures; present only once the run completed
    runs/<name>/tables/*.csv    tables (per-position accuracy, analysis outputs)
    runs/<name>/checkpoints/    step_XXXXXXX.pt, for --resume

Every file is written to a temporary name and renamed (os.replace is atomic on POSIX), and a new
run folder is assembled under a hidden name and renamed into place, so a killed process never
leaves a half-written file. metrics.jsonl is the one append-only file: its last line may be cut
by a kill; readers drop such a line and report it.

`load_runs(root)` -> DataFrame, one row per run (config and summary flattened with dotted
column names); folders that are not readable runs are skipped and listed in `df.attrs["skipped"]`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pandas as pd

CONFIG, METRICS, SUMMARY, TABLES, CHECKPOINTS = "config.json", "metrics.jsonl", "summary.json", "tables", "checkpoints"


def _clean(obj):
    """JSON-safe: NaN/inf become None (JSON has no NaN), tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(path: Path, obj) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
    with os.fdopen(fd, "w") as f:
        df.to_csv(f, index=False)
    os.replace(tmp, path)
    return path


def read_json(path: Path):
    with open(path) as f:
        return json.load(f)


class Run:
    """A run folder. Create with Run.create (atomic) or open an existing one with Run(path)."""

    def __init__(self, path):
        self.path = Path(path)

    @property
    def name(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, root, name: str, config: dict) -> "Run":
        """Make root/name with config.json in one atomic rename; fails if it already exists."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        final = root / name
        if final.exists():
            raise FileExistsError(f"run folder {final} already exists (use --resume to continue it)")
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
        try:
            write_json(tmp / CONFIG, config)
            (tmp / METRICS).touch()
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls(final)

    @property
    def config(self) -> dict:
        return read_json(self.path / CONFIG)

    @property
    def summary(self) -> dict | None:
        p = self.path / SUMMARY
        return read_json(p) if p.exists() else None

    @property
    def is_complete(self) -> bool:
        return (self.path / SUMMARY).exists()

    def log(self, record: dict) -> None:
        """Append one metrics record (one line, flushed), so a kill loses at most that line."""
        line = json.dumps(_clean(record), sort_keys=True)
        with open(self.path / METRICS, "a") as f:
            f.write(line + "\n")
            f.flush()

    def metrics_records(self) -> list[dict]:
        records, _ = _read_jsonl(self.path / METRICS)
        return records

    def truncate_metrics(self, last_step: int) -> None:
        """Keep only records with step <= last_step (resume from a checkpoint at last_step)."""
        keep = [r for r in self.metrics_records() if r.get("step", -1) <= last_step]
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".metrics.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            for r in keep:
                f.write(json.dumps(r, sort_keys=True) + "\n")
        os.replace(tmp, self.path / METRICS)

    def write_summary(self, summary: dict) -> None:
        write_json(self.path / SUMMARY, summary)

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        return write_table(self.path, name, df)

    def tables(self) -> dict[str, Path]:
        d = self.path / TABLES
        return {p.stem: p for p in sorted(d.glob("*.csv"))} if d.exists() else {}

    def checkpoint_dir(self) -> Path:
        d = self.path / CHECKPOINTS
        d.mkdir(exist_ok=True)
        return d

    def latest_checkpoint(self) -> Path | None:
        d = self.path / CHECKPOINTS
        ckpts = sorted(d.glob("step_*.pt")) if d.exists() else []
        return ckpts[-1] if ckpts else None


def _read_jsonl(path: Path) -> tuple[list[dict], int]:
    records, bad = [], 0
    if not Path(path).exists():
        return records, bad
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1  # a line cut by a kill
    return records, bad


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
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
    root = Path(root)
    rows, skipped = [], []
    if root.is_dir():
        for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            cfg_path = d / CONFIG
            if not cfg_path.exists():
                skipped.append((d.name, "no config.json (not a run folder, or half-written)"))
                continue
            try:
                config = read_json(cfg_path)
                summary = read_json(d / SUMMARY) if (d / SUMMARY).exists() else None
            except (json.JSONDecodeError, OSError) as e:
                skipped.append((d.name, f"unreadable JSON: {e}"))
                continue
            if not isinstance(config, dict) or not isinstance(summary, (dict, type(None))):
                skipped.append((d.name, "config.json or summary.json is not a JSON object"))
                continue
            if summary is None and not include_incomplete:
                skipped.append((d.name, "incomplete: no summary.json (running, or killed; --resume it)"))
                continue
            row = {"run": d.name, "path": str(d), "status": "complete" if summary is not None else "incomplete"}
            row.update(_flatten(config, "config."))
            row.update(_flatten(summary or {}, "summary."))
            rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["skipped"] = skipped
    for name, reason in skipped:
        if not reason.startswith("incomplete"):
            warnings.warn(f"skipped run folder {name!r}: {reason}", stacklevel=2)
    return df


def load_metrics(run, kind: str | None = None) -> pd.DataFrame:
    """A run's metrics.jsonl as a DataFrame (nested fields flattened); `kind` filters records.

    `run` is a run folder path, a Run, or a row of load_runs. A last line cut by a kill is
    dropped and counted in df.attrs["dropped_lines"].
    """
    if isinstance(run, Run):
        path = run.path
    elif isinstance(run, pd.Series):
        path = Path(run["path"])
    else:
        path = Path(run)
    records, bad = _read_jsonl(path / METRICS)
    if kind is not None:
        records = [r for r in records if r.get("kind") == kind]
    df = pd.DataFrame([_flatten(r) for r in records])
    df.attrs["dropped_lines"] = bad
    return df


def load_table(run, name: str) -> pd.DataFrame | None:
    """tables/<name>.csv of a run, or None when the run has no such table."""
    path = Path(run["path"] if isinstance(run, pd.Series) else getattr(run, "path", run)) / TABLES / f"{name}.csv"
    return pd.read_csv(path) if path.exists() else None
