"""Every fenced code block of README.md and docs/*.md is checked, so the docs cannot drift from the
code.

One rule per block, decided by its fence and the line before it:

- a block right after `<!-- excerpt: PATH -->` quotes PATH (a walk-through of the library's code):
  each of its non-blank lines, whitespace-normalised and without its comment, must be a line of
  PATH. Comments are the docs' own annotations; the code they annotate is what must match.
- any other ```python block is a complete program: it is run in a fresh interpreter (from a
  temporary folder, the repository on PYTHONPATH), unless NOT_RUN lists it with the reason.
- ```bash / ```sh / ```console blocks: every `lrt-lab SUBCOMMAND --flag` (and
  `python -m lrt_lab ...`) names a real subcommand and its real flags (read from the parser
  `lrt_lab.commands.cli.build_parser` builds), every `make TARGET` is a Makefile target, and every
  path of a
  repository file they name exists. `...`, `SPEC` and other placeholders are allowed as arguments.
  A `python -c PROGRAM` command is run like a ```python block.
- an untagged block is text (program output, a layout, a usage synopsis) and is not checked.

A block in any other language fails until a rule for it is added here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from lrt_lab.commands.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = ("bash", "sh", "console")
KNOWN_LANGUAGES = ("python", "", *SHELL)

# Complete-looking ```python blocks that are not run: (file name, a phrase unique to the block) ->
# why.
NOT_RUN = {
    (
        "scale.md",
        "DistributedPackingLoader(data_dir",
    ): "a sketch of the pretraining data path: needs FineWeb shards on disk (data_dir), a trained "
    "tokenizer, a checkpoint dict (ckpt) and a CUDA device",
}
PROGRAM_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    excerpt_of: str | None  # the PATH of a preceding `<!-- excerpt: PATH -->`

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
EXCERPT = re.compile(r"^<!--\s*excerpt:\s*(\S+)\s*-->$")


def fenced_blocks(doc: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, each with its language and excerpt marker."""
    lines = doc.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, end = opening.group(2), i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = "\n".join(line[len(opening.group(1)) :] for line in lines[i + 1 : end])
        blocks.append(Block(doc, i + 1, opening.group(3).lower(), body, excerpt_marker(lines, i)))
        i = end + 1
    return blocks


def excerpt_marker(lines: list[str], fence_index: int) -> str | None:
    """The path of an `<!-- excerpt: PATH -->` on the last non-blank line before the fence."""
    for line in reversed(lines[:fence_index]):
        if line.strip():
            marker = EXCERPT.match(line.strip())
            return marker.group(1) if marker else None
    return None


ALL_BLOCKS = [block for doc in DOCS for block in fenced_blocks(doc)]


def blocks_where(predicate) -> list:
    chosen = [b for b in ALL_BLOCKS if predicate(b)]
    return [pytest.param(b, id=b.name) for b in chosen]


# Excerpts ----------------------------------------------------------------------------------------


def code_part(line: str) -> str:
    """A line without its comment, whitespace-normalised: a `#` inside a string literal is kept."""
    quote, escaped = None, False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif quote and char == "\\":
            escaped = True
        elif quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#":
            line = line[:i]
            break
    return " ".join(line.split())


def lines_missing_from(snippet: str, source: str) -> list[str]:
    """The snippet's code lines that are no line of the
    source (comments and blank lines ignored)."""
    source_lines = {code_part(line) for line in source.splitlines()}
    wanted = [code_part(line) for line in snippet.splitlines()]
    return [line for line in wanted if line and line not in source_lines]


def test_code_part_ignores_comments_and_spacing_but_not_code():
    assert code_part("    x  = f(y)   # why") == "x = f(y)"
    assert code_part('s = "a # b"  # c') == 's = "a # b"'
    assert code_part("s = 'it\\'s # here'") == "s = 'it\\'s # here'"
    assert lines_missing_from("a = 1  # doc's note\n\nb = 2", "a  = 1\nb = 3") == ["b = 2"]


@pytest.mark.parametrize("block", blocks_where(lambda b: b.excerpt_of))
def test_excerpt_matches_its_source(block):
    source = REPO / block.excerpt_of
    assert source.is_file(), (
        f"{block.name}: the excerpt marker names {block.excerpt_of}, not a file"
    )
    missing = lines_missing_from(block.text, source.read_text())
    assert not missing, (
        f"{block.name}: lines not in {block.excerpt_of} (the code changed?):\n" + "\n".join(missing)
    )


# Programs ----------------------------------------------------------------------------------------


def is_program(block: Block) -> bool:
    return block.language == "python" and not block.excerpt_of


def reason_not_run(block: Block) -> str | None:
    doc = block.doc.name
    reasons = (
        why for (name, phrase), why in NOT_RUN.items() if name == doc and phrase in block.text
    )
    return next(reasons, None)


def test_every_block_not_run_is_listed_once():
    for doc, phrase in NOT_RUN:
        matches = [
            b.name for b in ALL_BLOCKS if is_program(b) and b.doc.name == doc and phrase in b.text
        ]
        assert len(matches) == 1, (
            f"NOT_RUN entry {(doc, phrase)} matches {matches or 'no block'}: update it"
        )


def run_program(source: str, name: str, folder: Path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", source],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=PROGRAM_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("block", blocks_where(is_program))
def test_program_runs(block, tmp_path):
    why = reason_not_run(block)
    if why:
        pytest.skip(f"not run: {why}")
    run_program(block.text, block.name, tmp_path)


# Shell commands
# ------------------------------------------------------------------------------------


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block as argument lists: continuations and quotes spanning lines
    joined,
    comments and prompts dropped."""
    commands, pending = [], ""
    for line in re.sub(r"\\\n", " ", text).splitlines():
        pending += ("\n" if pending else "") + re.sub(r"^\s*\$\s+", "", line)  # a console prompt
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on on the next line
            continue
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value before the command
            words = words[1:]
        if words:
            commands.append(words)
        pending = ""
    assert not pending, f"unclosed quote in: {pending}"
    return commands


def lrt_lab_arguments(words: list[str]) -> list[str] | None:
    """The arguments after `lrt-lab` / `python -m lrt_lab`, or None for another command."""
    if words[0] == "lrt-lab":
        return words[1:]
    if words[:3] in (["python", "-m", "lrt_lab"], ["python3", "-m", "lrt_lab"]):
        return words[3:]
    return None


def option_strings(parser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def unknown_lrt_lab_flags(arguments: list[str]) -> list[str]:
    """What the CLI's own parser does not know in `lrt-lab
    ARGUMENTS`: the subcommand or any --flag."""
    parser = build_parser()
    global_flags = option_strings(parser)
    words = [w for w in arguments if w not in global_flags]
    subparsers = next(a for a in parser._actions if a.choices and a.dest == "command").choices
    if not words or words[0] not in subparsers:
        return [f"subcommand {words[0] if words else '(none)'!r}"]
    command = subparsers[words[0]]
    # e.g. analyze: the rest goes to its own parser
    if any(a.nargs == "..." for a in command._actions):
        return []
    known = option_strings(command)
    return [w for w in words[1:] if re.match(r"--?[A-Za-z]", w) and w.split("=")[0] not in known]


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.MULTILINE)}


REPO_FILE = re.compile(r"^(?![~/<$])[\w./-]+/[\w.-]+\.(py|toml|sh|md|json|ipynb)$")


def problems_of_shell_block(text: str) -> list[str]:
    problems = []
    for words in shell_commands(text):
        arguments = lrt_lab_arguments(words)
        if arguments is not None:
            problems += [
                f"`{' '.join(words)}`: unknown {bad}" for bad in unknown_lrt_lab_flags(arguments)
            ]
        if words[0] == "make":
            targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
            problems += [
                f"`{' '.join(words)}`: no Makefile target {t!r}"
                for t in targets
                if t not in makefile_targets()
            ]
        problems += [
            f"`{' '.join(words)}`: no file {w}"
            for w in words
            if REPO_FILE.match(w) and not (REPO / w).exists()
        ]
    return problems


def test_shell_checks_catch_what_drifted():
    assert problems_of_shell_block("lrt-lab train ... --steps 10 --resume  # a comment") == []
    assert problems_of_shell_block("$ lrt-lab demo --quick \\\n    --threads 1") == []
    assert problems_of_shell_block("make demo ARGS='--quick'\nmake test") == []
    assert len(problems_of_shell_block("lrt-lab train --no-such-flag 1")) == 1
    assert len(problems_of_shell_block("lrt-lab tran --steps 1")) == 1
    assert len(problems_of_shell_block("python -m lrt_lab demo --fast")) == 1
    assert len(problems_of_shell_block("make benchmarks")) == 1
    assert len(problems_of_shell_block("lrt-lab sweep experiments/no_such_spec.toml")) == 1
    assert len(problems_of_shell_block("OMP_NUM_THREADS=1 lrt-lab demo --fast")) == 1


@pytest.mark.parametrize("block", blocks_where(lambda b: b.language in SHELL))
def test_shell_block_names_real_commands(block):
    problems = problems_of_shell_block(block.text)
    assert not problems, f"{block.name}:\n" + "\n".join(problems)


def python_c_programs(text: str) -> list[str]:
    """The PROGRAM of every `python -c PROGRAM` command of a shell block."""
    return [
        words[2]
        for words in shell_commands(text)
        if words[0] in ("python", "python3") and len(words) > 2 and words[1] == "-c"
    ]


@pytest.mark.parametrize(
    "block", blocks_where(lambda b: b.language in SHELL and python_c_programs(b.text))
)
def test_python_c_commands_run(block, tmp_path):
    for program in python_c_programs(block.text):
        run_program(program, block.name, tmp_path)


# Coverage of the rules
# -------------------------------------------------------------------------------


def test_every_block_has_a_rule():
    unknown = [f"{b.name} ({b.language})" for b in ALL_BLOCKS if b.language not in KNOWN_LANGUAGES]
    assert not unknown, "no rule for these blocks' language (add one here): " + ", ".join(unknown)
    # the extraction found the blocks
    assert len(ALL_BLOCKS) > 20 and any(b.excerpt_of for b in ALL_BLOCKS)
