"""The code outside the tests keeps its functions short: none spans more than 80 lines.

A long function is one that does several things without naming them; past this bound a reader
has to hold too much at once. The bound counts the body from the `def` line to its last line
(decorators excluded), for every function and method, nested ones included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
# Packages walked recursively; experiments/ only at its top (its subfolders are run stores).
PACKAGES = ("lrt_lab", "tasks", "scale", "app", "results", "scripts", "notebooks")
TOP_LEVEL_ONLY = ("experiments",)

# Functions allowed over the bound, each with the reason it cannot be split (none today). A
# listed function that is short again fails the test, so the list cannot go stale.
ALLOWED: set[tuple[str, str]] = set()


def source_files() -> list[Path]:
    files = []
    for name in PACKAGES:
        files += sorted((ROOT / name).rglob("*.py"))
    for name in TOP_LEVEL_ONLY:
        files += sorted((ROOT / name).glob("*.py"))
    return [f for f in files if not {"tests", ".venv", "__pycache__"} & set(f.parts)]


def function_lengths(tree: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function and method under `tree`, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node.end_lineno - node.lineno + 1
            yield from function_lengths(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from function_lengths(node, f"{prefix}{node.name}.")
        else:
            yield from function_lengths(node, prefix)


def long_functions(files, root: Path = ROOT) -> dict[tuple[str, str], int]:
    found = {}
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, lines in function_lengths(tree):
            if lines > MAX_LINES:
                found[(path.relative_to(root).as_posix(), name)] = lines
    return found


def test_the_walk_finds_the_packages():
    rel = {f.relative_to(ROOT).as_posix() for f in source_files()}
    assert {"lrt_lab/commands/cli.py", "scale/train.py", "app/views.py"} <= rel
    assert "experiments/results_tables.py" in rel
    assert not any(r.startswith("tests/") for r in rel)


def test_a_long_function_is_found(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))  # def line + 80 = 81 lines
    short = "\n".join(f"    y{i} = {i}" for i in range(MAX_LINES - 1))  # exactly 80 lines
    (tmp_path / "m.py").write_text(
        f"@decorator\ndef long():\n{body}\n\n"
        f"class C:\n    def method(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n\n"
        f"def short():\n{short}\n",
        encoding="utf-8",
    )
    found = long_functions([tmp_path / "m.py"], root=tmp_path)
    assert found == {("m.py", "long"): 81, ("m.py", "C.method"): 81}


def test_no_function_over_the_bound():
    found = long_functions(source_files())
    new = {k: v for k, v in found.items() if k not in ALLOWED}
    lines = [f"{path}: {name} spans {n} lines" for (path, name), n in sorted(new.items())]
    assert not new, f"functions over {MAX_LINES} lines:\n" + "\n".join(lines)
    stale = sorted(ALLOWED - set(found))
    assert not stale, f"allowed as long but now short (remove from ALLOWED): {stale}"
