"""The committed run store (`experiments/results/`), docs/results.md and its compact
"What the sandbox found" tables built from it.

The tables come from lrt_lab's run store and seed statistics; here each cell is recomputed from
the runs' JSON files with the standard library alone and looked up in the printed table, and the
committed docs/results.md must be exactly what experiments/results_tables.py
generates from the store, so no table can go stale."""

import importlib.util
import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from lrt_lab.store.results import load_runs

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "experiments" / "results"


def _tables_module():
    spec = importlib.util.spec_from_file_location(
        "results_tables", ROOT / "experiments" / "results_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport the project installs there
    import tomli as tomllib


def _study_prefixes() -> tuple[str, ...]:
    """The run-name prefixes of the A5 trainer study and its pilot, read from their specs: runs of
    another recipe, which the earlier tables leave out."""
    specs = ("a5_trainers.toml", "a5_recipe.toml")
    return tuple(
        tomllib.loads((ROOT / "experiments" / n).read_text())["sweep"]["name_prefix"] for n in specs
    )


def _runs_by_method(task: str) -> dict:
    """{training length: {(label, init): [summary.eval dicts]}} for complete runs of `task`, read
    straight from the files (the label names what differs from the paper preset's base)."""
    out = defaultdict(lambda: defaultdict(list))
    for folder in sorted(STORE.iterdir()):
        if not (folder / "summary.json").is_file() or folder.name.startswith(_study_prefixes()):
            continue
        config = json.loads((folder / "config.json").read_text())
        if (
            config["train"]["task"] != task
            or config["train"]["task_options"].get("supervise_every", 1) != 1
        ):
            continue  # (every k-th position supervised: the truncation table's)
        kind, schedule = config["kind"], config["schedule"]
        method = kind if schedule == "onepass" and kind != "lrt" else f"{kind} {schedule}"
        mem = config["model"].get("memory") or {}
        where, init = "", "-"
        if kind == "lrt":
            init = (
                "start-as-transformer"
                if mem.get("gamma_init") == 0 and mem.get("rec_init") == "zero"
                else "paper init"
            )
            if config["train"].get("memory_preset") == "released":
                where = ", released preset"
            else:
                if mem.get("source_layer") is not None:
                    where = f", memory from block {mem['source_layer']}"
                for field, default in (("source_tap", "resid"), ("projections", "shared")):
                    if mem.get(field, default) != default:
                        where += f", {mem[field]}"
        label = f"{method} ({config['model']['n_layer']} layers{where})"
        summary = json.loads((folder / "summary.json").read_text())
        out[config["train"]["length"]][(label, init, config["train"]["steps"])].append(summary)
    # runs of one label and init trained for different numbers of steps are different rows, each
    # label then saying its steps
    named = defaultdict(lambda: defaultdict(list))
    for length, groups in out.items():
        for (label, init, steps), summaries in groups.items():
            mixed = len({s for (l, i, s) in groups if (l, i) == (label, init)}) > 1
            named[length][(f"{label} ({steps} steps)" if mixed else label, init)] = summaries
    return named


def _row(table: str, label: str, init: str | None = None) -> list[str]:
    """The row whose first cell is `label` (and, given `init`, whose memory cell names it)."""
    for line in table.splitlines():
        # a cell's own "|" is written "\\|" (a group name: "transformer | steps=3000")
        line = line.replace("\\|", "\0")
        cells = [c.strip().replace("\0", "|") for c in line.strip().strip("|").split("|")]
        if (
            len(cells) > 1
            and cells[0] == label
            and (init is None or (init in cells[1] if init != "-" else cells[1] == "-"))
        ):
            return cells
    raise AssertionError(f"no row {label!r} ({init}) in\n{table}")


@pytest.mark.parametrize("task", ["a5_prefix", "z60_prefix"])
def test_state_tracking_table_matches_the_run_files(task):
    by_length = _runs_by_method(task)
    assert by_length, f"experiments/results/ holds no complete {task} runs"
    tables = _tables_module()
    df = tables.earlier_runs(load_runs(STORE))
    for length, runs in by_length.items():
        table = tables.state_tracking_table(df[df["config.train.length"] == length], task, None)
        header = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
        lengths = [
            int(h.split()[-1])
            for h in header
            if h.startswith("pos@90 at") and not h.endswith("per seed")
        ]
        assert lengths and lengths[0] == length, header
        col = {h: i for i, h in enumerate(header)}  # columns by name: the table may gain others
        for (label, init), summaries in runs.items():
            evals = [s["eval"] for s in summaries]
            cells = _row(table, label, init)
            compute = statistics.mean(s["compute_tokens"] for s in summaries) / 1e6
            assert cells[col["compute (M token-forwards, not FLOPs)"]] == f"{compute:.1f}", (
                label,
                cells,
            )
            for n in lengths:
                values = [e[f"pos90_exact@{n}"] for e in evals]
                cell = cells[col[f"pos@90 at {n}"]]
                assert cell.startswith(f"{statistics.mean(values):.1f}"), (label, n, cell)
                assert f"(n={len(values)})" in cell
            acc = statistics.mean(e[f"acc_exact@{lengths[0]}"] for e in evals)
            assert cells[col[f"accuracy at {lengths[0]}"]].startswith(f"{acc:.3f}"), (label, cells)
            per_seed = sorted(cells[col[f"pos@90 at {lengths[0]} per seed"]].split(", "))
            assert per_seed == sorted(str(e[f"pos90_exact@{lengths[0]}"]) for e in evals), (
                label,
                cells,
            )
            parallel = cells[col[next(h for h in header if h.startswith("parallel forward"))]]
            assert sorted(parallel.split(", ")) == sorted(
                "/".join(str(e[f"pos90_parallel@{n}"]) for n in lengths) for e in evals
            ), (label, parallel)


def test_gap_table_deltas_and_recovered_fraction_match_the_bpb_tables():
    """From each run's tables/bpb.csv: every run scored on the same held-out tokens; per method the
    mean paired Delta (method minus transformer, exact decoding) and the gap recovered as a ratio
    of means, mean Delta(method) / mean Delta(exact), over the seeds both share."""
    bpb, tokens = defaultdict(dict), set()
    for folder in sorted(STORE.iterdir()):
        csv = folder / "tables" / "bpb.csv"
        if not csv.is_file() or not (folder / "summary.json").is_file():
            continue
        config = json.loads((folder / "config.json").read_text())
        if config["train"]["task"] != "text_bytes":
            continue
        exact = next(
            line.split(",") for line in csv.read_text().splitlines() if line.startswith("exact,")
        )
        tokens.add(int(exact[4]))
        method = config["kind"] if config["kind"] != "lrt" else f"lrt {config['schedule']}"
        bpb[method][config["train"]["seed"]] = float(exact[3])
    assert {"transformer", "lrt exact"} <= set(bpb), sorted(bpb)
    assert len(tokens) == 1, f"runs scored on different held-out sets: {sorted(tokens)} tokens"
    table = _tables_module().gap_table(load_runs(STORE))
    assert f"({tokens.pop()} tokens)" in table.split("\n\n")[0]
    base = bpb["transformer"]
    for method in set(bpb) - {"transformer"}:
        seeds = sorted(set(bpb[method]) & set(base))
        delta = statistics.mean(bpb[method][s] - base[s] for s in seeds)
        cells = _row(table, method)
        assert cells[2].startswith(f"{delta:+.4f} ["), (method, cells)
        assert f"(n={len(seeds)})" in cells[2]
        if method != "lrt exact":
            shared = sorted(set(seeds) & set(bpb["lrt exact"]))
            recovered = statistics.mean(bpb[method][s] - base[s] for s in shared) / statistics.mean(
                bpb["lrt exact"][s] - base[s] for s in shared
            )
            assert cells[5] == f"{100 * recovered:.0f}%", (method, cells)


def test_frontier_points_are_the_runs_that_differ_only_in_their_trainer():
    """From the files: A5 at length 16, every position supervised, the transformer or an LRT of
    the paper preset with no override; a method whose runs differ in steps is split by steps."""
    from lrt_results.report import frontier_points

    expect = []
    for folder in sorted(STORE.iterdir()):
        if not (folder / "summary.json").is_file() or folder.name.startswith(_study_prefixes()):
            continue
        config = json.loads((folder / "config.json").read_text())
        train = config["train"]
        if (train["task"], train["length"]) != ("a5_prefix", 16) or "supervise_every" in train[
            "task_options"
        ]:
            continue
        if train.get("overrides") or (
            config["kind"] == "lrt" and train.get("memory_preset", "paper") != "paper"
        ):
            continue
        summary = json.loads((folder / "summary.json").read_text())
        method = "transformer" if config["kind"] == "transformer" else f"lrt {config['schedule']}"
        expect.append(
            (
                method,
                train["steps"],
                train["seed"],
                summary["compute_tokens"] / 1e6,
                summary["eval"]["pos90_exact@16"],
                summary["eval"]["pos90_exact@64"],
            )
        )
    assert expect, "no A5 length-16 runs in the store"
    points = frontier_points(_tables_module().earlier_runs(load_runs(STORE)))
    got = sorted(
        (t.split(" | ")[0], s, c, p16, p64)
        for t, s, c, p16, p64 in points[
            ["trainer", "seed", "compute", "pos90_exact@16", "pos90_exact@64"]
        ].itertuples(index=False)
    )
    want = sorted((m, s, c, p16, p64) for m, _, s, c, p16, p64 in expect)
    # row by row: pytest.approx takes no nested structures from pytest 9.2 on
    assert [row[:2] for row in got] == [row[:2] for row in want]
    for g, w in zip(got, want):
        assert g[2:] == pytest.approx(w[2:]), (g, w)
    # every view's name for a group (run_groups.seed_groups): "steps=N" exactly where a trainer
    # trained other steps than most trainers did
    by_trainer = defaultdict(set)
    for m, n, *_ in expect:
        by_trainer[m].add(n)
    methods = {(m, n) for m, n, *_ in expect}
    counts = Counter(n for _, n in methods)
    usual = counts.most_common(1)[0][0]
    for (m, n), trainer in zip(
        sorted(methods), sorted(set(points["trainer"]), key=lambda t: (t.split(" | ")[0], t))
    ):
        assert trainer.split(" | ")[0] == m
        assert (f"steps={n}" in trainer) == (n != usual), (trainer, n, usual)


def test_frontier_table_and_figure_are_built_from_the_points(tmp_path):
    tables = _tables_module()
    df = tables.earlier_runs(load_runs(STORE))
    from lrt_results.report import frontier_points

    points = frontier_points(df)
    table = tables.frontier_table(df)
    for trainer, runs in points.groupby("trainer"):
        cells = _row(table, trainer)
        assert cells[1] == f"{runs['compute'].mean():.1f}"
        assert cells[5] == f"{int((runs['pos90_exact@16'] == 16).sum())} of {len(runs)}"
    tables.frontier_figure(df, tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _supervised_pos90(accuracies: list) -> int:
    """pos@90 over the supervised positions (None: unsupervised): the last supervised position
    before the first supervised one below 90%, 0 when the first one is."""
    last = 0
    for position, acc in enumerate(accuracies, start=1):
        if acc is None:
            continue
        if acc < 0.9 - 1e-6:
            return last
        last = position
    return last


def test_truncation_table_lists_every_supervised_every_kth_run():
    """Each run with supervise_every = k > 1 appears in the k column of its trainer's row, with
    pos@90 over its supervised positions per evaluated length, read from its per_position.csv
    (empty accuracy: an unsupervised position), and its final training loss."""
    counted = defaultdict(list)
    for folder in sorted(STORE.iterdir()):
        if not (folder / "summary.json").is_file():
            continue
        config = json.loads((folder / "config.json").read_text())
        k = config["train"]["task_options"].get("supervise_every", 1)
        if config["train"]["task"] == "a5_prefix" and k > 1:
            summary = json.loads((folder / "summary.json").read_text())
            curves = defaultdict(dict)
            lines = (folder / "tables" / "per_position.csv").read_text().splitlines()
            for line in lines[1:]:
                length, mode, position, acc = line.split(",")
                if mode == "exact":
                    curves[int(length)][int(position)] = float(acc) if acc else None
            pos = [_supervised_pos90([c[p] for p in sorted(c)]) for _, c in sorted(curves.items())]
            counted[(f"lrt {config['schedule']}", k)].append(
                f"{'/'.join(map(str, pos))} ({summary['final_loss']:.2f})"
            )
    table = _tables_module().truncation_table(load_runs(STORE))
    if not counted:
        assert table is None
        return
    header = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    for (trainer, k), cells in counted.items():
        row = _row(table, trainer)
        assert sorted(row[header.index(f"k = {k}")].split(", ")) == sorted(cells), (trainer, k)


@pytest.fixture(scope="module")
def tables():
    """results_tables whose stale() builds each page from the committed store once for this module:
    a page's tables take seconds of seed statistics and the store does not change meanwhile. The
    store is read and every table built the first time; later calls compare against that text."""
    module = _tables_module()
    runs, built = {}, {}

    def load_runs_once(store, *args, **kwargs):
        key = (str(store), args, tuple(sorted(kwargs.items())))
        if key not in runs:
            runs[key] = load_runs(store, *args, **kwargs)
        return runs[key]

    def once(build):
        def cached(*args):
            key = (build.__name__, *(id(a) if hasattr(a, "columns") else a for a in args))
            if key not in built:
                built[key] = build(*args)
            return built[key]

        return cached

    module.load_runs = load_runs_once  # the same frame each time, so its id keys the tables
    # the study's tables, then each page, built once per frame
    module.trainer_study_results = once(module.trainer_study_results)
    module.render_results = once(module.render_results)
    module.compact_block = once(module.compact_block)
    return module


@pytest.mark.slow
@pytest.mark.xdist_group("results_tables")  # the module's tables fixture, built once
def test_results_page_is_what_the_store_gives(tables):
    """docs/results.md (its "In short" summary included) regenerated from the committed store
    equals the committed file (`python experiments/results_tables.py --write` after a change to
    the store or template)."""
    differ = tables.stale(STORE)
    assert not differ, (
        f"{[str(p.relative_to(ROOT)) for p in differ]} differ from what the run store gives; "
        "run python experiments/results_tables.py --write"
    )
    page = (ROOT / "docs" / "results.md").read_text()
    assert "<!-- table:" not in page  # every placeholder of the template was filled
    assert tables.missing_figures(ROOT) == []


def test_a_linked_figure_that_is_missing_is_reported(tmp_path):
    """--check fails on a page that links an image nobody drew (a study's figure before --write)."""
    tables = _tables_module()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text(
        "![frontier](a5_trainer_frontier.png)\n![curves](a5_trainer_study_curves.png)\n"
    )
    (tmp_path / "docs" / "a5_trainer_frontier.png").write_bytes(b"png")
    assert tables.missing_figures(tmp_path) == [tmp_path / "docs" / "a5_trainer_study_curves.png"]


@pytest.mark.xdist_group("results_tables")  # the module's tables fixture, built once
def test_one_changed_cell_is_caught(tables, tmp_path):
    """A copy of the committed page with one table cell changed is reported: a cell of its summary
    (In short) and a cell of a full table. The README is never read."""
    (tmp_path / "docs").mkdir()
    name = "docs/results.md"
    (tmp_path / name).write_text((ROOT / name).read_text())
    assert tables.stale(STORE, tmp_path) == []
    text = (tmp_path / name).read_text()
    rows = [line for line in text.splitlines() if line.startswith("| transformer")]
    summary_end = text.index("\n## ", text.index("## In short"))
    in_short = next(r for r in rows if text.index(r) < summary_end)
    full = next(r for r in rows if text.index(r) > summary_end)
    for row in (in_short, full):
        cells = row.split("|")
        cells[-2] = " 99.9 "  # the last cell of the row
        (tmp_path / name).write_text(text.replace(row, "|".join(cells), 1))
        assert tables.stale(STORE, tmp_path) == [tmp_path / name], row
        (tmp_path / name).write_text(text)


def test_in_short_a5_rows_match_the_run_files():
    """The A5 rows at length 16 of docs/results.md's summary (In short): mean exact pos@90 at 16 /
    32 / 64, the seeds that reach 16 and the mean compute, recomputed from the runs' JSON files."""
    tables = _tables_module()
    page = (ROOT / "docs" / "results.md").read_text()
    block = page.split("## In short")[1].split("\n## ")[0]
    a5 = block.split("**A5 at length 16")[1].split("\n\n**")[0]
    runs = _runs_by_method("a5_prefix")[16]
    for label, init in tables.A5_AT_16:
        summaries = next(v for (l, i), v in runs.items() if l == label and (init == i or init in i))
        cells = _row(a5, tables.short(label))
        means = [
            statistics.mean(s["eval"][f"pos90_exact@{n}"] for s in summaries) for n in (16, 32, 64)
        ]
        assert cells[1] == " / ".join(f"{m:.1f}" for m in means), (label, cells)
        learned = sum(s["eval"]["pos90_exact@16"] >= 16 for s in summaries)
        assert cells[2] == f"{learned} of {len(summaries)}", (label, cells)
        compute = statistics.mean(s["compute_tokens"] for s in summaries) / 1e6
        assert cells[3] == f"{compute:.1f}", (label, cells)


# The prose: every figure of docs/results.md's text and of its summary (In short) is a value of
# results_tables.prose_values, so a prose number cannot disagree with the table it comes from.


@pytest.fixture(scope="module")
def store_values():
    """(results_tables, the committed store, its prose values), computed once for this module."""
    module = _tables_module()
    df = module.earlier_runs(load_runs(STORE))
    return module, df, module.prose_values(df)


def _sections(template: str) -> dict[str, str]:
    parts = re.split(r"(?m)^(?=## )", template)
    return {p.splitlines()[0] if p.startswith("## ") else "(intro)": p for p in parts if p.strip()}


# typed on purpose: the Speed section's earlier measurement is a typed table of a bench result the
# generator cannot read (it says so), and the paper's figures beside it
TYPED_SECTIONS = ("## Speed",)


def test_results_prose_holds_no_typed_decimal():
    """Outside value placeholders and code spans (settings such as `FixedPoint(0.1, 8)` or
    `tol=0.1`), no section of the template but Speed states a decimal number: a figure from the
    store is rendered from it, never typed."""
    module = _tables_module()
    typed = []
    for head, text in _sections(module.TEMPLATE.read_text()).items():
        if head.startswith(TYPED_SECTIONS):
            continue
        text = module.VALUE.sub(" ", text)
        text = re.sub(r"`[^`]*`", " ", text)
        typed += [(head, m.group(0)) for m in re.finditer(r"(?<![\w.])\d+\.\d+", text)]
    assert not typed, typed


def test_every_value_the_prose_names_is_computed(store_values):
    module, _, named = store_values
    names = set(module.VALUE.findall(module.TEMPLATE.read_text()))
    assert len(names) > 50, "the template's prose has lost its value placeholders"
    assert names <= set(named) | module.PAGE_VALUES, sorted(names - set(named))
    # filled by in_short itself: a link, and the study's sentence from its own runs
    fields = set(re.findall(r"\{([\w@.-]+)\}", module.IN_SHORT)) - {"protocol_link", "study.status"}
    assert fields <= set(named), sorted(fields - set(named))


def test_prose_numbers_agree_with_their_tables(store_values):
    """The figures the prose states are the cells of the tables beside it (and of the page's
    compact tables), each built by its own code path."""
    module, df, named = store_values
    at8 = module.compact_state_tracking(df, "a5_prefix", 8, module.A5_AT_8)
    for label, key in (("lrt fullseq:3", "fullseq3"), ("lrt exact", "exact")):
        assert _row(at8, label)[2] == named[f"a5_8.{key}.learned"], (label, at8)
    full8 = module.state_tracking_table(df[df["config.train.length"] == 8], "a5_prefix", None)
    header = [c.strip() for c in full8.split("\n\n")[1].splitlines()[0].strip("|").split("|")]
    cells = _row(full8, "lrt fullseq:3 (4 layers)")
    assert cells[header.index("pos@90 at 8 per seed")] == named["a5_8.fullseq3.pos90"]
    at16 = module.compact_state_tracking(df, "a5_prefix", 16, module.A5_AT_16)
    assert _row(at16, "lrt fixedpoint:0.1:8")[2] == named["a5_16.fp01_8.learned"]
    assert _row(at16, "lrt rollout:1")[2] == named["frontier.rollout1.learned"]
    frontier = module.frontier_table(df)
    assert _row(frontier, "lrt fixedpoint:0.01:16")[5] == named["frontier.fp001_16.learned"]
    gap = module.gap_table(df)
    assert _row(gap, "lrt exact")[2].startswith(named["gap.exact.delta"])
    assert _row(gap, "lrt exact")[3] == named["gap.exact.p"]
    assert _row(gap, "lrt interleaved:2")[5] == named["gap.il.recovered"]
    assert _row(gap, "lrt fullseq:3")[5] == named["gap.fullseq3.recovered"]
    protocol = module.protocol_table(df)
    rows = [
        [c.strip().replace("\0", "|") for c in line.replace("\\|", "\0").strip("|").split("|")]
        for line in protocol.splitlines()[2:]
    ]
    by = {(r[0], r[2]): r for r in rows}
    short, long = named["protocol.short"], named["protocol.long"]
    assert by[("transformer | steps=3000", short)][4].startswith(
        named["protocol.t_short.exact"] + " ("
    )
    assert by[("lrt interleaved:2", short)][5].startswith(named["protocol.il.parallel"] + " (")
    assert by[("lrt interleaved:2 | steps=3000", long)][5].startswith(
        named["protocol.il_long.parallel"] + " ("
    )
    baselines = module.baselines_table(df)
    assert _row(baselines, "lrt interleaved:2")[7].startswith(named["base.il.welch_p"] + ";")
    assert _row(baselines, "lrt interleaved:2")[3].startswith(named["base.il.acc"])
    truncation = module.truncation_table(df)
    k4 = [c.strip() for c in truncation.split("\n\n")[1].splitlines()[0].strip("|").split("|")]
    column = k4.index("k = 4")
    for line in truncation.split("\n\n")[1].splitlines()[2:]:
        cell = [c.strip() for c in line.strip("|").split("|")][column]
        assert cell.startswith(named["trunc.k4.pos90"] + "/"), cell


def test_a_changed_run_changes_the_prose_with_its_table(store_values):
    """One stored figure changed (FullSequence(3)'s seed that stopped at pos@90 2 at length 8 now
    reaches 8): the prose of the length-8 section and the summary's compact row change together,
    and nothing in the prose still says the old count."""
    module, df, named = store_values
    sub = module.labelled(df[df["config.train.length"] == 8], "a5_prefix")
    runs = module.compact_rows(sub, *module.A5_AT_8_KEYS["fullseq3"])
    column = "summary.eval.pos90_exact@8"
    stalled = runs[runs[column] < 8].index[0]
    changed = df.copy()
    changed.loc[stalled, column] = 8
    values = module.prose_values(changed)
    before_count, after_count = named["a5_8.fullseq3.learned"], values["a5_8.fullseq3.learned"]
    assert before_count != after_count
    at8 = module.compact_state_tracking(changed, "a5_prefix", 8, module.A5_AT_8)
    assert _row(at8, "lrt fullseq:3")[2] == after_count
    template = module.TEMPLATE.read_text()
    study = dict.fromkeys(module.PAGE_VALUES, "")  # another section's, from the study's tables
    before = _sections(module.render_prose(template, {**named, **study}))
    after = _sections(module.render_prose(template, {**values, **study}))
    before, after = (s["## A5 state tracking at length 8"] for s in (before, after))
    assert before != after
    fullseq = [line for line in after.splitlines() if "FullSequence(3)" in line]
    assert any(after_count in line for line in after.splitlines()), fullseq
    assert named["a5_8.fullseq3.pos90"] not in after  # the old per-seed figures are gone


RECIPE_SPEC = """
[sweep]
tasks = ["a5_prefix"]
models = ["transformer", "lrt", "transformer_lr0.04", "lrt_lr0.04"]
schedules = ["interleaved:2"]
seeds = [20]

[train]
length = 16
preset = "tiny"
steps = 20

[models."transformer_lr0.04"]
model = "transformer"
matrix_lr = 0.04

[models."lrt_lr0.04"]
model = "lrt"
matrix_lr = 0.04
"""
# exact-decoding cross-entropy at length 16 at steps 10 and 20, per (kind, Muon rate)
RECIPE_CE = {
    ("transformer", 0.02): (2.0, 1.5),
    ("transformer", 0.04): (1.9, 1.7),
    ("lrt", 0.02): (1.0, 0.9),
    ("lrt", 0.04): (0.8, 0.6),
}


def test_recipe_pilot_table_picks_the_lowest_cross_entropy_per_model(tmp_path, monkeypatch):
    """The learning-rate pilot's table: the end value, its change over the last interval and the
    rule's pick, from a fabricated store of the pilot's grid."""
    from lrt_lab.training.sweep import expand, load_spec

    tables = _tables_module()
    spec = tmp_path / "recipe.toml"
    spec.write_text(RECIPE_SPEC)
    monkeypatch.setattr(tables, "RECIPE_PILOT", spec)
    store = tmp_path / "store"
    for cfg in expand(load_spec(spec)):
        folder = store / cfg.run_name
        folder.mkdir(parents=True)
        rate = cfg.matrix_lr if cfg.matrix_lr is not None else 0.02
        ce = RECIPE_CE[cfg.model, rate]
        config = {"kind": cfg.model, "schedule": "onepass" if cfg.model != "lrt" else cfg.schedule}
        config["train"] = {"task": "a5_prefix", "length": 16, "steps": 25, "matrix_lr": rate}
        config["train"]["eval_every"] = 10
        (folder / "config.json").write_text(json.dumps(config))
        summary = {"status": "complete", "eval": {"ce_exact@16": ce[1], "pos90_exact@16": 3}}
        (folder / "summary.json").write_text(json.dumps(summary))
        # evaluations at 10 and 20, then at the last step (25): the change is read from step 10
        lines = [{"kind": "eval", "step": s, "ce_exact@16": v} for s, v in zip((10, 20), ce)]
        lines.append({"kind": "eval", "step": 25, "ce_exact@16": ce[1]})
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    text = tables.recipe_pilot_table(load_runs(store))
    assert "Runs: 4 of the pilot's 4 complete" in text
    assert "pick, the lowest CE per model: lrt interleaved:2 0.04, transformer 0.02." in text
    rows = {(r[0], r[1]): r for r in (_cells(line) for line in text.splitlines()[2:]) if r}
    assert rows["method", "Muon rate"][4] == "change, last 10 steps"
    assert rows["transformer", "0.02"][3:] == ["1.5000", "-0.5000", "3", "picked"]
    assert rows["transformer", "0.04"][3:] == ["1.7000", "-0.2000", "3", ""]
    assert rows["lrt interleaved:2", "0.04"][6] == "picked"
    assert tables.recipe_pilot_table(load_runs(store).iloc[:0]).startswith("None of the pilot's 4")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")] if line.startswith("| ") else []


def test_gap_contrasts_give_the_t_interval_of_the_paired_differences():
    """With 3 pairs a percentile bootstrap is far too narrow (it excluded 0 where the paired t-test
    gave p = 0.07): the gap table's interval is Student's t of the mean paired difference, worked
    out here by hand (t_{0.975, 2} = 4.302653)."""
    import pandas as pd

    tables = _tables_module()
    transformer = [2.40, 2.42, 2.38]
    exact = [2.35, 2.40, 2.31]  # differences -0.05, -0.02, -0.07
    runs = pd.DataFrame(
        {
            "config.train.seed": [0, 1, 2] * 2,
            "method": ["transformer"] * 3 + ["lrt exact"] * 3,
            "bpb.exact": transformer + exact,
        }
    )
    row = tables.gap_contrasts(runs).set_index("method").loc["lrt exact"]
    diffs = [e - t for e, t in zip(exact, transformer)]
    half = 4.302653 * statistics.stdev(diffs) / 3**0.5
    assert row["effect"] == pytest.approx(statistics.mean(diffs))
    assert row["ci_low"] == pytest.approx(statistics.mean(diffs) - half, rel=1e-5)
    assert row["ci_high"] == pytest.approx(statistics.mean(diffs) + half, rel=1e-5)
    assert row["ci_low"] < 0 < row["ci_high"]  # this spread does not exclude 0


def test_the_study_sentence_waits_for_every_run_then_gives_each_contrast_and_reach():
    """The summary's sentence on the trainer study: a count while runs are missing (no effect is
    quoted before the data are whole), then every primary-metric contrast with its interval, Holm
    p and verdict, a contrast of another metric as its own clause, and each arm's seeds that
    reached the training length with the median compute and log-rank p of its row."""
    import math

    import pandas as pd

    tables = _tables_module()
    rows = [
        ("transformer", "lrt interleaved:2", "ce_exact@16", 0.25, 0.1, 0.4, 0.012, True),
        ("transformer", "lrt rollout:1", "ce_exact@16", -0.05, -0.2, 0.1, 0.5, False),
        ("transformer", "lrt interleaved:2", "ce_parallel@16", -0.3, -0.4, -0.2, 0.01, True),
    ]
    table = pd.DataFrame(
        rows, columns=["a", "b", "metric", "effect", "ci_low", "ci_high", "p_holm", "decided"]
    ).assign(pairs=8)
    events = pd.DataFrame(
        [
            (
                "transformer",
                "lrt interleaved:2",
                "exact",
                "0/8",
                "0/8",
                math.nan,
                math.nan,
                math.nan,
            ),
            ("transformer", "lrt rollout:1", "exact", "0/8", "5/8", math.nan, 4.4e13, 0.004),
            ("transformer", "lrt interleaved:2", "parallel", "0/8", "3/8", math.nan, math.nan, 0.2),
            ("transformer", "lrt fixedpoint:0.1:8", "exact", "0/8", "8/8", math.nan, 9e13, 4e-4),
        ],
        columns=[
            "a",
            "b",
            "decoding",
            "reached_a",
            "reached_b",
            "median_a",
            "median_b",
            "p_logrank",
        ],
    )
    table.attrs["runs"] = 5
    waiting = tables.study_status(table, events, 32, "ce_exact@16", "Heading", 16)
    assert "5 of its 32 runs are in" in waiting and "+0.250" not in waiting
    assert "reached" not in waiting
    table.attrs["runs"] = 32
    done = tables.study_status(table, events, 32, "ce_exact@16", "Heading", 16)
    assert "8 pairs" in done and "Holm over all 3 contrasts" in done
    primary = done[: done.index("as their own rows")]
    assert (
        "lrt interleaved:2 against transformer +0.250 [+0.100, +0.400] (Holm p = 0.012, decided)"
        in primary
    )
    assert (
        "lrt rollout:1 against transformer -0.050 [-0.200, +0.100] (Holm p = 0.5, not decided)"
        in primary
    )
    assert "-0.300" not in primary  # the parallel-forward row is not the primary metric
    assert (
        "in ce_parallel@16, lrt interleaved:2 against transformer -0.300 [-0.400, -0.200] "
        "(Holm p = 0.01, decided)" in done
    )
    reach = done[done.index("first reached") :]
    assert reach.count("transformer (") == 1  # the shared arm once
    # at least half reached, fastest median first; fewer than half, no median; none, no p
    most = reach[reach.index("on at least half") : reach.index("on fewer than half")]
    assert most.index(
        "lrt rollout:1 (exact decoding) on 5 of 8 (median 4.4e+13 FLOPs, log-rank p = 0.004)"
    ) < most.index(
        "lrt fixedpoint:0.1:8 (exact decoding) on 8 of 8 (median 9e+13 FLOPs, log-rank p < 0.001)"
    )
    assert (
        "on fewer than half by lrt interleaved:2 (parallel decoding) on 3 of 8 (log-rank p = "
        "0.20); on none by transformer (exact decoding), lrt interleaved:2 (exact decoding)."
        in reach
    )
    # the training length is the study's, not a constant of the sentence
    assert "The training length (pos@90 = 16)" in done and "cross-entropy at length 16" in done
    at_8 = tables.study_status(table, events, 32, "ce_exact@16", "Heading", 8)
    assert "The training length (pos@90 = 8)" in at_8 and "cross-entropy at length 8" in at_8
    assert "improving" not in done and "lost more than half" not in done  # no flattening table
    # the results page's sentence under the table: the same findings, or the count until then
    from types import SimpleNamespace

    study = SimpleNamespace(primary="ce_exact@16")
    results = tables.TrainerStudyResults(study, ["run"] * 32, 16, table, events, pd.DataFrame())
    assert tables.trainer_study_answer(results) in done
    table.attrs["runs"] = 31
    assert tables.trainer_study_answer(results) == (
        "not yet: 31 of its 32 runs are in, and its contrasts are read when all are."
    )


def test_the_study_sentence_names_collapses_and_a_censored_reference():
    """With the flattening table: the arms whose primary metric ended having lost more than half
    its gain, with their counts, and the reference arm's censoring when it was still improving at
    its end on at least half its seeds (and not when it had flattened)."""
    import pandas as pd

    tables = _tables_module()
    flat = pd.DataFrame(
        [
            ("transformer", "ce_exact@16", "6/8", "0/8"),
            ("lrt rollout:1", "ce_exact@16", "8/8", "2/8"),
            ("lrt fixedpoint:0.1:8", "ce_exact@16", "1/8", "0/8"),
            ("lrt interleaved:2", "ce_parallel@16", "8/8", "3/8"),  # not the primary metric
        ],
        columns=["arm", "metric", "improving", "regressed"],
    )
    text = tables.flattening_sentence(flat, "ce_exact@16", "transformer")
    assert (
        "(a run that learned, then lost it, reads at its end as one that never learned): lrt "
        "rollout:1 on 2 of 8." in text
    )
    assert "interleaved" not in text and "fixedpoint" not in text
    assert "The transformer was still improving at its end on 6 of 8 seeds" in text
    flat.loc[0, "improving"] = "3/8"
    flat.loc[1, "regressed"] = "0/8"
    assert tables.flattening_sentence(flat, "ce_exact@16", "transformer") == ""
