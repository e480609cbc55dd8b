"""The table `lrt-lab demo` prints has the shape docs/tour.md shows ("The demo"), and the README
describes it truly.

The tour's table is a condensed copy of what the demo printed: one row per decoding where the demo
prints one per length ("L = 12 / 24 / 48"), the accuracy rows likewise, run names as the models
they are, and the accuracy at the positions the text names left out. The test undoes that
condensing and compares the structure: the columns, the row labels, and each cell's number format
(an integer, a decimal, a thousands-separated count...), never the numbers themselves, which a run
changes. The demo runs for real, through run_demo with its `--quick` settings, cut to 2 steps of
a small batch: the same code prints the same table in seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from pathlib import Path

import pytest

from lrt_lab.commands import demo

REPO = Path(__file__).resolve().parent.parent
TOUR = REPO / "docs" / "tour.md"
README = REPO / "README.md"
# The run a column shows -> its heading in the tour
COLUMNS = {
    "demo-transformer": "transformer",
    "demo-lrt-interleaved2": "LRT, Interleaved(2)",
    "demo-lrt-fullseq3": "LRT, FullSequence(3)",
}
# The tour's wording of a row -> the demo's
WORDING = {
    "pos@90, parallel forward": "pos@90 parallel",
    "pos@90, exact recurrent decoding": "pos@90 exact",
    "L = ": "L=",
}


def number_format(cell: str) -> str:
    """The cell with each number replaced by its kind: '430,214 (+8.5% memory)' -> '<n,> (+<x.y>%
    memory)'. Bold (**...**) is the tour's emphasis, not a format."""
    cell = cell.replace("**", "").strip()
    cell = re.sub(r"\d{1,3}(?:,\d{3})+", "<n,>", cell)
    cell = re.sub(r"\d+\.\d+", "<x.y>", cell)
    return re.sub(r"\d+", "<n>", cell)


def decimals(cells) -> int:
    """The most digits after a decimal point in any of the cells."""
    return max((len(d) for cell in cells for d in re.findall(r"\d\.(\d+)", cell)), default=0)


def tour_excerpt() -> tuple[list[str], dict[str, tuple[list[str], int]], set[str]]:
    """(column headings, {the demo's row label: (the tour's cells, decimals)}, rows left out).

    A cell the tour splits (`1.0 / 0.844 / ...`) becomes one cell of each row it stands for.
    decimals: the most any cell of the tour's row shows, the rounding every cell keeps to (one
    cell alone may show fewer: 1.0 beside 0.844)."""
    text = TOUR.read_text()
    section = text[text.index("\n## The demo\n") :]
    section = section[: section.index("\n## ", 1)]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert len(lines) > 2, "docs/tour.md's 'The demo' has no table"

    def cells(line):
        parts = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        return [part.strip().replace("\\|", "|") for part in parts]

    heading, rows = cells(lines[0])[1:], {}
    for line in lines[2:]:  # after the heading and the |---| line
        label, *values = cells(line)
        for theirs, ours in WORDING.items():
            label = label.replace(theirs, ours)
        listed = re.search(r"\d+(?: / \d+)+", label)  # one row of the tour for several of the demo
        if listed is None:
            rows[label] = values, decimals(values)
            continue
        keys = listed.group().split(" / ")
        split = [value.replace("**", "").split(" / ") for value in values]
        assert all(len(s) == len(keys) for s in split), f"{line!r}: a value for each of {keys}"
        for i, key in enumerate(keys):
            label_i = label[: listed.start()] + key + label[listed.end() :]
            rows[label_i] = [s[i] for s in split], decimals(values)
    prose = " ".join(section.split())
    left_out = re.search(r"accuracy at positions (\d+(?:(?:, | and )\d+)*) left out", prose)
    positions = re.findall(r"\d+", left_out.group(1)) if left_out else []
    length = max(demo.EVAL_LENGTHS)
    return heading, rows, {f"accuracy at position {p} (exact, L={length})" for p in positions}


def printed_table(out: str) -> tuple[list[str], dict[str, list[str]]]:
    """(column names, {row label: cells}) of the table in the demo's output."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(" ") and "demo-" in line)
    end = lines.index("", start)
    columns, rows = lines[start].split(), {}
    for line in lines[start + 1 : end]:
        label, *values = re.split(r" {2,}", line.rstrip())
        assert len(values) == len(columns), f"not one cell a column: {line!r}"
        rows[label] = values
    return columns, rows


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """What run_demo prints, every run cut to 2 steps of 8 sequences and 16 evaluated a length:
    accuracies of k/16 (0.0625, 0.1875...) show whether the table rounds them."""

    def small(quick=False):
        return [
            dataclasses.replace(
                cfg,
                steps=2,
                batch_size=8,
                eval_size=16,
                task_options={**cfg.task_options, "curriculum_steps": 1},
            )
            for cfg in full(quick)
        ]

    full = demo.demo_configs
    out = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo, "demo_configs", small)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            demo.run_demo(out=str(out), quick=True, quiet=True, threads=1)
    return stdout.getvalue()


def test_the_demo_prints_the_columns_and_rows_the_tour_shows(printed):
    heading, tour_rows, left_out = tour_excerpt()
    columns, rows = printed_table(printed)
    assert [c.removesuffix("-quick") for c in columns] == list(COLUMNS)
    assert heading == list(COLUMNS.values())
    assert left_out <= set(rows), f"the tour says it leaves out rows the demo lacks: {left_out}"
    assert set(tour_rows) == set(rows) - left_out, (
        f"only in the tour: {sorted(set(tour_rows) - set(rows))}; "
        f"only printed: {sorted(set(rows) - left_out - set(tour_rows))}"
    )


def test_each_printed_cell_has_the_number_format_the_tour_shows(printed):
    _, tour_rows, _ = tour_excerpt()
    _, rows = printed_table(printed)
    for label, (values, most_decimals) in tour_rows.items():
        got = [number_format(v) for v in rows[label]]
        assert got == [number_format(v) for v in values], f"{label}: printed {rows[label]}"
        assert decimals(rows[label]) <= most_decimals, f"{label}: printed {rows[label]}"


def test_the_readme_describes_the_same_table():
    text = " ".join(README.read_text().split())
    assert demo.EVAL_LENGTHS == tuple(k * demo.TRAIN_LENGTH for k in (1, 2, 4))
    assert (
        "at 1x, 2x and 4x the training length, with the training schedule's parallel forward "
        "and with exact recurrent decoding ([docs/tour.md](docs/tour.md#the-demo) shows what "
        "it printed)"
    ) in text
    _, tour_rows, _ = tour_excerpt()
    for length in demo.EVAL_LENGTHS:
        assert {f"pos@90 parallel (L={length})", f"pos@90 exact (L={length})"} <= set(tour_rows)
