"""GitHub-flavoured markdown tables: the one writer behind every table the lab prints as
markdown (`report --format md`, study reports, bench ratios, the generated pages in docs/)."""

from __future__ import annotations


def markdown_lines(header: list[str], rows: list[list[str]], left=None) -> list[str]:
    """The lines of a markdown table. A `|` inside a cell is escaped, so that a run-group label
    (whose parts are joined by one) stays in its cell. `left`: indices of the columns to align
    left, the others aligned right; None leaves the alignment to the renderer."""
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"every row needs {len(header)} cells, one per column of {header}")
    align = ["---" if left is None else ":--" if i in left else "--:" for i in range(len(header))]

    def line(cells) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "|".join(align) + "|", *(line(row) for row in rows)]
