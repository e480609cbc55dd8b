"""`lrt-lab report` on a store written by hand: each study's own metric (BPB for byte-level text,
pos@90 for state tracking) against figures computed here, md and csv that read back to the same
numbers, short labels, the filters, and no torch or scipy loaded to answer."""

from __future__ import annotations

import io
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lrt_lab.commands.cli import main
from lrt_results.report import format_number, print_report
from lrt_results.stats import t_quantile

REPO = Path(__file__).resolve().parent.parent
LN2 = math.log(2)

# (task, length, kind, schedule, overrides, seed) -> (pos@90 exact at the length, ce_exact or None,
# wall seconds)
RUNS = {
    ("a5_prefix", 8, "transformer", "onepass", (), 0): (4, 0.9, 100.0),
    ("a5_prefix", 8, "transformer", "onepass", (), 1): (5, 0.8, 110.0),
    ("a5_prefix", 8, "transformer", "onepass", (), 2): (7, 0.7, 120.0),
    ("a5_prefix", 8, "lrt", "interleaved:2", (), 0): (8, 0.1, 200.0),
    ("a5_prefix", 8, "lrt", "interleaved:2", (), 1): (6, 0.2, 210.0),
    ("a5_prefix", 8, "lrt", "interleaved:2", (("memory.source_layer", 1),), 0): (3, 0.3, 190.0),
    ("a5_prefix", 16, "lrt", "interleaved:2", (), 0): (12, 0.4, 400.0),
    ("text_bytes", 16, "transformer", "onepass", (), 0): (0, 1.70, 50.0),
    ("text_bytes", 16, "transformer", "onepass", (), 1): (0, 1.74, 52.0),
    ("text_bytes", 16, "lrt", "exact", (), 0): (0, 1.61, 80.0),
    ("text_bytes", 16, "lrt", "exact", (), 1): (0, None, 81.0),  # older: tables/bpb.csv
    ("text_bytes", 16, "lrt", "exact", (), 2): (0, None, 82.0),  # neither: not counted
}
BPB_TABLE = 2.3456  # tables/bpb.csv's exact BPB of the older text run
COST = {"onepass": 1.0, "interleaved:2": 2.0, "exact": 1.0}


def run_name(task, length, kind, schedule, overrides, seed) -> str:
    tag = "-src1" if overrides else ""
    return f"{task}-L{length}-tiny-{kind}-{schedule.replace(':', '_')}{tag}-s{seed}"


def write_store(root: Path) -> Path:
    for key, (pos90, ce, wall) in RUNS.items():
        task, length, kind, schedule, overrides, seed = key
        folder = root / run_name(*key)
        folder.mkdir(parents=True)
        memory = {"source_layer": dict(overrides).get("memory.source_layer")}
        config = {
            "kind": kind,
            "schedule": schedule,
            "schedule_cost": COST[schedule],
            "forwards_per_token": 1,
            "model": {"n_layer": 2, "n_embd": 32, **({"memory": memory} if kind == "lrt" else {})},
            "train": {
                "task": task,
                "length": length,
                "task_options": {"group": "A5"} if task != "text_bytes" else {},
                "preset": "tiny",
                "model": kind,
                "schedule": schedule,
                "overrides": dict(overrides),
                "steps": 100,
                "seed": seed,
                "name": None,
            },
        }
        ev = {f"pos90_exact@{length}": pos90, f"acc_exact@{length}": 0.5}
        if ce is not None:
            ev[f"ce_exact@{length}"] = ce
        summary = {
            "status": "complete",
            "final_loss": 1.0,
            "wall_time_s": wall,
            "tokens": 1000,
            "compute_tokens": 1000 * COST[schedule],
            "schedule_cost": COST[schedule],
            "forwards_per_token": 1,
            "eval": ev,
        }
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "summary.json").write_text(json.dumps(summary))
        if key == ("text_bytes", 16, "lrt", "exact", (), 1):
            (folder / "tables").mkdir()
            pd.DataFrame(
                [
                    {"mode": "parallel", "stage": None, "bpb": BPB_TABLE + 1},
                    {"mode": "exact", "stage": None, "bpb": BPB_TABLE},
                ]
            ).to_csv(folder / "tables" / "bpb.csv", index=False)
    return root


@pytest.fixture
def store(tmp_path) -> Path:
    return write_store(tmp_path / "store")


def report(capsys, *args) -> tuple[int, str, str]:
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def csv_report(capsys, *args) -> pd.DataFrame:
    code, out, err = report(capsys, *args, "--format", "csv")
    assert code == 0, err
    return pd.read_csv(io.StringIO(out))


def t_interval(values):
    mean = statistics.mean(values)
    half = t_quantile(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def test_each_study_has_its_metric_and_the_text_one_is_bpb_by_hand(store, capsys):
    table = csv_report(capsys, store).set_index(["task", "length", "group"])
    # state tracking: pos@90 with exact decoding at the training length
    tr = table.loc[("a5_prefix", 8, "transformer")]
    assert tr["metric"] == "pos@90 exact@8" and tr["n"] == 3 and tr["seeds"] == "0 1 2"
    # the t-interval reaches above 8, which pos@90 at 8 cannot: clipped there, and marked
    mean, lo, hi = t_interval([4, 5, 7])
    assert hi > 8 and lo > 0
    assert (tr["mean"], tr["ci_low"], tr["ci_high"]) == pytest.approx((mean, lo, 8.0))
    assert bool(tr["clipped"])
    assert tr["std"] == pytest.approx(statistics.stdev([4, 5, 7])) and tr["cost"] == 1.0
    assert tr["wall_time_s"] == pytest.approx(110.0)
    lrt = table.loc[("a5_prefix", 8, "lrt interleaved:2")]
    assert lrt["mean"] == pytest.approx(7) and lrt["n"] == 2 and lrt["cost"] == 2.0
    # what tells the groups apart, and nothing else
    assert set(table.loc[("a5_prefix", 8)].index) == {
        "transformer",
        "lrt interleaved:2",
        "lrt interleaved:2 | memory.source_layer=1",
    }
    assert table.loc[("a5_prefix", 16, "lrt interleaved:2"), "mean"] == 12
    # byte-level text: BPB = ce_exact@L / ln 2, or tables/bpb.csv for a run from before ce_exact
    text = table.loc[("text_bytes", 16)]
    assert set(text["metric"]) == {"BPB exact@16"}
    bpb = [1.70 / LN2, 1.74 / LN2]
    assert text.loc["transformer", "mean"] == pytest.approx(statistics.mean(bpb), rel=1e-12)
    assert text.loc["transformer", ["ci_low", "ci_high"]].tolist() == pytest.approx(
        t_interval(bpb)[1:], rel=1e-12
    )
    assert text.loc["lrt exact", "mean"] == pytest.approx((1.61 / LN2 + BPB_TABLE) / 2)
    assert text.loc["lrt exact", "n"] == 2 and text.loc["lrt exact", "seeds"] == "0 1"
    # the notes (csv: on stderr) say which runs are read from tables or lack the metric
    _, _, err = report(capsys, store, "--format", "csv")
    assert "from tables/bpb.csv" in err and run_name("text_bytes", 16, "lrt", "exact", (), 1) in err
    assert (
        "have no BPB exact@16" in err and run_name("text_bytes", 16, "lrt", "exact", (), 2) in err
    )


def test_the_table_is_short_rounded_and_left_aligned(store, capsys):
    code, out, _ = report(capsys, store)
    assert code == 0 and "pos@90" in out and "BPB exact@16" in out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100
    header = next(line for line in lines if line.startswith("group") and "BPB" in line)
    rows = lines[lines.index(header) + 1 : lines.index(header) + 3]
    assert [r.split("  ")[0] for r in rows] == ["lrt exact", "transformer"]  # left-aligned labels
    mean, lo, hi = t_interval([1.70 / LN2, 1.74 / LN2])
    cell = f"{format_number(mean)} [{format_number(lo)}, {format_number(hi)}]"
    assert cell in rows[1] and cell == "2.481 [2.115, 2.848]"
    assert " 2.00 " in out  # cost with two decimals


@pytest.mark.parametrize(
    "value, text",
    [
        (7.3333333, "7.333"),
        (2.0, "2"),
        (14.0, "14"),
        (8.166444, "8.166"),
        (12345.6, "12346"),
        (0.000123456, "0.0001235"),
        (-4.3726, "-4.373"),
        (0.0, "0"),
        (math.nan, "-"),
    ],
)
def test_format_number_gives_four_significant_digits_without_an_exponent(value, text):
    assert format_number(value) == text


def _markdown_tables(text: str) -> dict[str, pd.DataFrame]:
    """heading -> its table, cells as text ("\\|" read as "|")."""
    tables, heading, rows = {}, None, []
    for line in text.splitlines() + [""]:
        if line.startswith("### "):
            heading = line[4:]
        elif line.startswith("|"):
            cells = [
                c.strip().replace("\x00", "|")
                for c in line.replace("\\|", "\x00").strip("|").split("|")
            ]
            rows.append(cells)
        elif rows:
            header, _, *body = rows
            tables[heading] = pd.DataFrame(body, columns=header)
            rows = []
    return tables


def test_md_and_csv_read_back_to_the_same_numbers(store, capsys):
    full = csv_report(capsys, store)
    code, out, _ = report(capsys, store, "--format", "md")
    assert code == 0
    tables = _markdown_tables(out)
    assert set(tables) == {
        "a5_prefix, trained at length 8",
        "a5_prefix, trained at length 16",
        "text_bytes, trained at length 16",
    }
    for (task, length), rows in full.groupby(["task", "length"]):
        md = tables[f"{task}, trained at length {length}"].set_index("group")
        metric = rows["metric"].iloc[0]
        assert list(md.columns) == [metric, "n", "std", "seeds", "cost", "wall s"]
        assert sorted(md.index) == sorted(rows["group"])
        for row in rows.itertuples(index=False):
            cell = md.loc[row.group]
            numbers = [
                float(x)
                for x in cell[metric]
                .replace("[", "")
                .replace(",", "")
                .replace("]", "")
                .replace("*", "")
                .split()
            ]
            expected = [row.mean] + ([row.ci_low, row.ci_high] if row.n > 1 else [])
            assert numbers == pytest.approx(expected, rel=5e-4), (row.group, cell[metric])
            assert numbers == [float(format_number(v)) for v in expected]
            assert int(cell["n"]) == row.n and cell["seeds"] == row.seeds
            assert float(cell["cost"]) == pytest.approx(row.cost, abs=0.005)
            assert float(cell["wall s"]) == pytest.approx(row.wall_time_s, rel=5e-3)
            if row.n > 1:
                assert float(cell["std"]) == pytest.approx(row.std, rel=5e-4)


def test_filters_select_the_runs(store, capsys):
    def selected(*args) -> set:
        table = csv_report(capsys, store, *args)
        return {(r.task, r.length, r.group, r.n) for r in table.itertuples()}

    assert {t for t, *_ in selected("--task", "text_bytes")} == {"text_bytes"}
    assert selected("--task", "a5_prefix", "--where", "train.length=16") == {
        ("a5_prefix", 16, "lrt interleaved:2", 1)
    }
    # several conditions, all must hold; the short form of a field and null for an unset one
    assert selected("--where", "kind=lrt", "--where", "n_layer=2", "--task", "a5_prefix") == {
        ("a5_prefix", 8, "lrt interleaved:2", 2),
        ("a5_prefix", 8, "lrt interleaved:2 | memory.source_layer=1", 1),
        ("a5_prefix", 16, "lrt interleaved:2", 1),
    }
    assert selected("--where", "model.memory.source_layer=1") == {
        ("a5_prefix", 8, "lrt interleaved:2", 1)  # alone: nothing to tell it apart from
    }
    assert {g for _, _, g, _ in selected("--where", "model.memory.source_layer=null")} == {
        "transformer",
        "lrt interleaved:2",
        "lrt exact",
    }
    assert selected("--prefix", "a5_prefix-L8-tiny-transformer") == {
        ("a5_prefix", 8, "transformer", 3)
    }
    for args, says in (
        (("--where", "nonsense=1"), "--where 'nonsense' is invalid"),
        (("--where", "kind"), "allowed: FIELD=VALUE"),
        (("--task", "copy"), "--task 'copy' is invalid"),
        (("--prefix", "zzz"), "no run of the store passes the filters"),
        (("--format", "xml"), "invalid choice"),
        (("--metric", "nope"), "--metric 'nope' is invalid"),
    ):
        try:
            code, _, err = report(capsys, store, *args)
        except SystemExit as e:
            code, err = e.code, capsys.readouterr().err
        assert code == 2 and says in err and err.count("\n") == 1, err


def test_report_loads_neither_torch_nor_scipy(store):
    code = (
        "import sys\n"
        "from lrt_lab.commands.cli import main\n"
        f"assert main(['report', {str(store)!r}]) == 0\n"
        f"assert main(['report', {str(store)!r}, '--format', 'csv']) == 0\n"
        "loaded = sorted(m for m in ('torch', 'scipy') if m in sys.modules)\n"
        "print('LOADED', loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout


def test_t_quantile_is_scipys():
    sps = pytest.importorskip("scipy.stats")
    for df in (*range(1, 60), 100, 1000, 1e5, 0.5, 2.5):
        for q in (0.6, 0.9, 0.95, 0.975, 0.995, 0.9995, 0.025):
            assert t_quantile(q, df) == pytest.approx(float(sps.t.ppf(q, df)), rel=1e-9)
    assert t_quantile(0.5, 3) == 0.0
    with pytest.raises(ValueError, match="0 < q < 1"):
        t_quantile(1.0, 3)


def test_print_report_returns_the_table(store, capsys):
    table = print_report(store, task="a5_prefix", where=["train.length=8"])
    assert table["n"].tolist() == [2, 1, 3]
    assert table["group"].tolist() == [
        "lrt interleaved:2",
        "lrt interleaved:2 | memory.source_layer=1",
        "transformer",
    ]
    capsys.readouterr()


def test_report_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as done:
        main(["report", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: lrt-lab report")
    for option in ("--metric", "--group-by", "--format", "--task", "--where", "--prefix"):
        assert option in out
    assert "%%" not in out and "95% t-interval" in out


def test_a_study_whose_runs_all_lack_the_metric_says_it_is_missing(store, capsys):
    """Text runs with neither ce_exact in their summary nor tables/bpb.csv: no table of dashes,
    one note saying BPB is missing and where it would come from."""
    code, out, _ = report(
        capsys, store, "--task", "text_bytes", "--prefix", "text_bytes-L16-tiny-lrt-exact-s2"
    )
    assert code == 0 and "BPB exact@16 is missing in every run of this study" in out
    assert "tables/bpb.csv" in out and "group" not in out


def test_recipe_suffix_names_only_the_options_a_group_mixes():
    """Runs of one trainer and step count at two learning rates are two recipes, each named; a
    group with one recipe keeps its plain label."""
    import pandas as pd

    from lrt_results.report import recipe_suffix

    df = pd.DataFrame(
        {
            "config.train.steps": [100, 100, 100, 200],
            "config.train.matrix_lr": [0.01, 0.04, 0.04, 0.01],
            "config.train.warmdown_frac": [0.3, 0.3, 0.3, 0.5],
        }
    )
    method = pd.Series(["transformer"] * 4)
    assert recipe_suffix(df, method).tolist() == [
        " (Muon 0.01)",
        " (Muon 0.04)",
        " (Muon 0.04)",
        "",
    ]
