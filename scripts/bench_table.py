"""Write the committed bench results (docs/bench/*.json) into docs/performance.md as a table.

    python scripts/bench_table.py           # rewrite the table between the bench-table markers
    python scripts/bench_table.py --check   # exit 1 when the page's table is not what the JSON
    gives

After committing a new `lrt-lab bench --json docs/bench/NAME.json`, run it so the page shows the
figures of the files, never hand-typed ones. The rendering itself is
lrt_lab.commands.bench.markdown_table.
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# this checkout's lrt_lab, not another installed copy: the page documents it
sys.path.insert(0, str(REPO))

from lrt_lab.commands.bench import load_results, markdown_table, replace_table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bench-dir", default=str(REPO / "docs" / "bench"), help="folder of bench JSON files"
    )
    parser.add_argument(
        "--page", default=str(REPO / "docs" / "performance.md"), help="markdown page to update"
    )
    parser.add_argument(
        "--check", action="store_true", help="only compare; exit 1 when out of date"
    )
    args = parser.parse_args(argv)
    page = Path(args.page)
    text = page.read_text()
    updated = replace_table(text, markdown_table(load_results(args.bench_dir)))
    if args.check:
        if updated != text:
            print(
                f"{page}: the bench table is out of date; run python scripts/bench_table.py",
                file=sys.stderr,
            )
            return 1
        return 0
    if updated != text:
        page.write_text(updated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
