"""A tiny real text corpus for the scale/ tests: the json and email packages' own sources."""

import email
import json
import re
from pathlib import Path


def stdlib_docs() -> list[str]:
    """One document per top-level block of the json and email packages' source files."""
    docs = []
    for pkg in (json, email):
        for f in sorted(Path(pkg.__file__).parent.glob("*.py")):
            docs += [p for p in re.split(r"\n\n\n+", f.read_text(encoding="utf-8")) if p.strip()]
    return docs
