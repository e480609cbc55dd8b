"""Extensions by file or module: what `--plugin FILE_OR_MODULE` loads, and the entry point groups.

A plugin is a Python file or an importable module that registers schedules
(`lrt_lab.register_schedule`) and memory mechanisms (`lrt_lab.register_memory`) when it is
imported (docs/extending.md). `load_plugin` imports it once per process: a file as a real module,
put in `sys.modules` before its code runs (so `@dataclass` under `from __future__ import
annotations`, which looks its module up there, works as in any imported module). A run records
its plugins (`TrainConfig.plugins`, a file by its absolute path), so resuming it, a sweep's
workers in other processes and `lrt-lab analyze` import them again.

An installed package can name its module under an entry point group instead, imported the first
time a name is not found: `lrt_lab.schedules` for schedules (`lrt_lab.run.registry`) and
`lrt_lab.memory_mechanisms` for memory mechanisms (`lrt_lab.core.config.MemoryConfig`).
`lrt_lab.commands` names what the lab reaches in the packages built on it (`provided`): the
report and the statistics of lrt_results, which lrt_lab never imports by name.

No torch here: the command line reads these names before it loads anything heavy (a plugin's own
imports load what they need).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

SCHEDULE_GROUP = "lrt_lab.schedules"
MECHANISM_GROUP = "lrt_lab.memory_mechanisms"
# What the lab hands to the package built on it (lrt_results: study statistics, report tables,
# figures): `lrt-lab report` and the analyses' seed intervals. The lab never imports that package
# by name (the import contract), so it finds each piece here at run time.
COMMAND_GROUP = "lrt_lab.commands"

# What a refusal of an unknown schedule or mechanism adds: the route to one of the user's own.
ROUTE = (
    "or register your own: load the file that defines it with --plugin FILE (Python: import it "
    "first; an installed package: the entry point group {group})"
)

_loaded: dict[str, str] = {}  # what load_plugin was given, resolved -> the module's name
_groups_loaded: set[str] = set()


def route(group: str) -> str:
    """The clause every refusal of an unknown registered name ends with."""
    return ROUTE.format(group=group)


def load_plugin(spec: str) -> str:
    """Import a plugin once: a path to a Python file (ends in .py, or names a file) or a module
    name. Returns how a run records it: the file's absolute path, or the module's name.
    ValueError (one line) when it is neither, or when importing it fails."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"plugin={spec!r} is invalid; allowed: a Python file (.py) or an importable module name"
        )
    spec = spec.strip()
    path = Path(spec).expanduser()
    is_file = spec.endswith(".py") or "/" in spec or "\\" in spec or path.is_file()
    key = str(path.resolve()) if is_file else spec
    if key in _loaded:
        return key
    if is_file:
        if not path.is_file():
            reason = "no such file" if not path.exists() else "not a file"
            raise ValueError(
                f"plugin={spec!r} is invalid: {reason}; allowed: a Python file (.py) or an "
                "importable module name"
            )
        name = _module_name(Path(key))
        try:
            _import_file(name, Path(key))
        except Exception as e:
            raise ValueError(f"plugin {spec!r} failed to load: {_one_line(e)}") from e
    else:
        if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", spec) is None:
            raise ValueError(
                f"plugin={spec!r} is invalid; allowed: a Python file (.py) or an importable "
                "module name"
            )
        try:
            importlib.import_module(spec)
        except ModuleNotFoundError as e:
            if e.name is not None and spec.startswith(e.name):  # the plugin itself is missing
                raise ValueError(
                    f"plugin={spec!r} is invalid: no such file or module; allowed: a Python file "
                    "(.py) or an importable module name"
                ) from None
            raise ValueError(f"plugin {spec!r} failed to load: {_one_line(e)}") from e
        except Exception as e:
            raise ValueError(f"plugin {spec!r} failed to load: {_one_line(e)}") from e
        name = spec
    _loaded[key] = name
    return key


def load_plugins(specs) -> tuple[str, ...]:
    """load_plugin for each (a list, a tuple; None: none), in order, each recorded once."""
    if specs is None:
        return ()
    if isinstance(specs, str) or not isinstance(specs, (list, tuple)):
        raise ValueError(
            f"plugins={specs!r} is invalid; allowed: a list of Python files or module names"
        )
    recorded = []
    for spec in specs:
        key = load_plugin(spec)
        if key not in recorded:
            recorded.append(key)
    return tuple(recorded)


def loaded_plugins() -> tuple[str, ...]:
    """Every plugin loaded in this process, as load_plugin returned it, in load order."""
    return tuple(_loaded)


def loaded_module(spec: str):
    """The module a loaded plugin became (for tests and tools), or None."""
    name = _loaded.get(spec) or _loaded.get(str(Path(spec).expanduser().resolve()))
    return sys.modules.get(name) if name else None


def load_entry_points(group: str) -> None:
    """Import the modules installed packages name under `group` (once per process)."""
    if group in _groups_loaded:
        return
    _groups_loaded.add(group)
    for ep in importlib.metadata.entry_points(group=group):
        ep.load()


def provided(name: str):
    """The object an installed package names `name` under the entry point group lrt_lab.commands
    (e.g. `report`, from lrt_results). ValueError (one line) when no installed package does."""
    found = importlib.metadata.entry_points(group=COMMAND_GROUP, name=name)
    for ep in found:
        return ep.load()
    raise ValueError(
        f"{name!r} is not installed: it is provided through the entry point group "
        f"{COMMAND_GROUP} (the lrt_results package); allowed: reinstall the project "
        "(pip install -e .)"
    )


def _module_name(path: Path) -> str:
    """The file's stem where that names no other module (so the plugin's classes read as
    `my_ext.Leaky`), else a name of its own derived from its path."""
    stem = path.stem
    if stem.isidentifier() and stem not in sys.modules:
        try:
            found = importlib.util.find_spec(stem)
        except (ImportError, ValueError):
            found = None
        if found is None or (found.origin and Path(found.origin).resolve() == path):
            return stem
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    safe = re.sub(r"\W", "_", stem)
    return f"lrt_lab_plugin_{safe}_{digest}"


def _import_file(name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before its code runs: dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _one_line(e: BaseException) -> str:
    first = str(e).splitlines()[0][:300] if str(e) else "no message"
    return f"{type(e).__name__}: {first}"
