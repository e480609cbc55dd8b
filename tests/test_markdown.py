"""The one markdown-table writer: cells stay in their columns, alignment is what was asked."""

import pytest

from lrt_lab.store.markdown import markdown_lines


def _cells(line: str) -> list[str]:
    """A table row read the way GitHub does: split on unescaped pipes, "\\|" is a literal pipe."""
    return [c.strip().replace("\x00", "|") for c in line.replace("\\|", "\x00")[1:-1].split("|")]


def test_a_pipe_inside_a_cell_stays_in_its_cell():
    rows = [["lrt | interleaved:2 | seeds 0-2", "1.5"], ["transformer", "1.6"]]
    lines = markdown_lines(["group", "BPB"], rows)
    assert [_cells(line) for line in lines[2:]] == rows
    assert _cells(lines[0]) == ["group", "BPB"]


@pytest.mark.parametrize(
    "left, marks",
    [(None, ["---", "---", "---"]), ((0,), [":--", "--:", "--:"]), ((0, 2), [":--", "--:", ":--"])],
)
def test_the_separator_row_carries_the_alignment_asked_for(left, marks):
    lines = markdown_lines(["a", "b", "c"], [["1", "2", "3"]], left=left)
    assert lines[1].strip("|").split("|") == marks


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        markdown_lines(["a", "b"], [["1", "2", "3"]])
