"""Extensions from the command line (`--plugin FILE_OR_MODULE`, lrt_lab.core.plugins), the entry
point groups, a command line that loads no torch before a command runs, and reports that write
nothing into the store they read."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrt_lab.core import plugins
from lrt_lab.core.config import MEMORY_MECHANISMS, MemoryConfig
from lrt_lab.run import registry

REPO = Path(__file__).resolve().parent.parent
EXTENDING = REPO / "docs" / "extending.md"
# the modules the tests below import as plugins
PLUGIN_MODULES = ("my_ext", "counted_ext", "named_ext_pkg", "ep_mech_module", "broken_ext")


@pytest.fixture
def isolated():
    """Whatever a test registers or imports as a plugin is gone after it, so the names it adds
    reach no other test of this process."""
    schedules, mechanisms = dict(registry.SCHEDULES), dict(MEMORY_MECHANISMS)
    loaded, groups, modules = dict(plugins._loaded), set(plugins._groups_loaded), set(sys.modules)
    yield
    added = set(plugins._loaded.values()) - set(loaded.values())
    registry.SCHEDULES.clear()
    registry.SCHEDULES.update(schedules)
    MEMORY_MECHANISMS.clear()
    MEMORY_MECHANISMS.update(mechanisms)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)
    plugins._groups_loaded.clear()
    plugins._groups_loaded.update(groups)
    for name in added | set(PLUGIN_MODULES):
        if name not in modules:
            sys.modules.pop(name, None)


def doc_section() -> str:
    text = EXTENDING.read_text()
    return text[text.index("## Extensions from the command line") :]


def doc_plugin_file() -> str:
    """The ```python block of the section: the file `my_ext.py`."""
    section = doc_section()
    start = section.index("```python\n# my_ext.py") + len("```python\n")
    return section[start : section.index("```", start)]


def doc_commands() -> list[list[str]]:
    """The `lrt-lab ...` commands of the section's ```bash block, as argument lists."""
    section = doc_section()
    start = section.index("```bash\n") + len("```bash\n")
    block = section[start : section.index("```", start)].replace("\\\n", " ")
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("lrt-lab ")]


def write_doc_plugin(folder: Path) -> Path:
    path = folder / "my_ext.py"
    path.write_text(doc_plugin_file())
    return path


# The registry's statement of the built-ins -------------------------------------------------------
def test_the_stated_builtin_spellings_are_the_registered_ones():
    builtins = [
        r.spelling
        for r in registry.registered().values()
        if r.cls.__module__ == registry.BUILTIN_MODULE
    ]
    assert tuple(builtins) == registry.BUILTIN_SPELLINGS
    assert list(registry.registered())[: len(builtins)] == list(registry.BUILTIN_NAMES)


# Loading -----------------------------------------------------------------------------------------
def test_a_file_is_a_real_module_loaded_once(tmp_path, isolated):
    path = tmp_path / "counted_ext.py"
    path.write_text(
        "from __future__ import annotations\n"
        "import dataclasses, typing\n"
        "import lrt_lab\n"
        "LOADS = [1]\n"
        "@lrt_lab.register_schedule('twopass_t:K')\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class TwoPass(lrt_lab.StagedSchedule):\n"
        "    K: int = 2\n"
        "    NOTE: typing.ClassVar[str] = 'a ClassVar string annotation'\n"
        "    def stages(self, T):\n"
        "        return [range(0, T)] * self.K\n"
        "    @property\n"
        "    def cost(self):\n"
        "        return float(self.K)\n"
    )
    key = plugins.load_plugin(str(path))
    assert key == str(path.resolve())
    module = plugins.loaded_module(str(path))
    assert sys.modules[module.__name__] is module and module.__name__ == "counted_ext"
    assert plugins.load_plugin(str(path)) == key and module.LOADS == [1]  # not run again
    assert plugins.load_plugins([str(path), str(path)]) == (key,)
    assert registry.parse_schedule("twopass_t:3").K == 3
    assert registry.parse_schedule("twopass_t:3").spec == "twopass_t:3"


def test_a_module_by_name_and_the_refusals(tmp_path, monkeypatch, isolated):
    (tmp_path / "named_ext_pkg").mkdir()
    (tmp_path / "named_ext_pkg" / "__init__.py").write_text(
        "import lrt_lab\n"
        "@lrt_lab.register_memory('named_mech')\n"
        "class Named(lrt_lab.MemoryPathway):\n"
        "    pass\n"
    )
    (tmp_path / "broken_ext.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugins.load_plugin("named_ext_pkg") == "named_ext_pkg"
    assert MemoryConfig(mechanism="named_mech").mechanism == "named_mech"
    with pytest.raises(ValueError, match="no such file; allowed: a Python file"):
        plugins.load_plugin(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match="no such file or module"):
        plugins.load_plugin("no_such_module_anywhere")
    with pytest.raises(ValueError, match="failed to load: RuntimeError: broken on purpose"):
        plugins.load_plugin(str(tmp_path / "broken_ext.py"))
    assert "broken_ext" not in sys.modules  # a failed import leaves no half module behind


def test_unknown_names_are_refused_naming_the_plugin_route():
    with pytest.raises(ValueError) as schedule:
        registry.parse_schedule("tailexact_unknown:4")
    assert "allowed: onepass, interleaved:S" in str(schedule.value)
    assert "--plugin FILE" in str(schedule.value) and "lrt_lab.schedules" in str(schedule.value)
    with pytest.raises(ValueError) as mechanism:
        MemoryConfig(mechanism="leaky_unknown")
    assert str(mechanism.value).startswith("memory.mechanism='leaky_unknown' is invalid")
    assert "--plugin FILE" in str(mechanism.value)
    assert "lrt_lab.memory_mechanisms" in str(mechanism.value)


def test_a_mechanism_from_the_entry_point_group(tmp_path, monkeypatch, isolated):
    """An installed package names its module under lrt_lab.memory_mechanisms: imported the first
    time an unknown mechanism is asked for, as lrt_lab.schedules is for a spelling."""
    import importlib.metadata

    (tmp_path / "ep_mech_module.py").write_text(
        "import lrt_lab\n"
        "@lrt_lab.register_memory('ep_mech')\n"
        "class FromEntryPoint(lrt_lab.MemoryPathway):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    asked = []

    def entry_points(group):
        asked.append(group)
        if group != plugins.MECHANISM_GROUP:
            return []
        return [importlib.metadata.EntryPoint("ep", "ep_mech_module", group)]

    monkeypatch.setattr(plugins.importlib.metadata, "entry_points", entry_points)
    plugins._groups_loaded.discard(plugins.MECHANISM_GROUP)
    assert MemoryConfig(mechanism="ep_mech").mechanism == "ep_mech"
    assert MemoryConfig(mechanism="ep_mech").mechanism == "ep_mech"
    assert asked == [plugins.MECHANISM_GROUP]  # looked up once


@pytest.mark.slow
def test_the_invariants_option_loads_a_file_of_dataclasses(tmp_path):
    """`pytest --memory-plugin FILE`: the doc's file (dataclasses under `from __future__ import
    annotations`) is collected with its mechanism in the option space."""
    path = write_doc_plugin(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            str(REPO / "tests" / "test_invariants.py"),
            "--memory-plugin",
            str(path),
            "-k",
            "leaky",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "INTERNALERROR" not in done.stdout + done.stderr
    assert "leaky" in done.stdout


# The doc's example, through the command line -----------------------------------------------------
def test_the_docs_plugin_trains_and_is_analyzed_from_the_command_line(
    tmp_path, monkeypatch, capsys, isolated
):
    from lrt_lab.commands.cli import main

    write_doc_plugin(tmp_path)
    monkeypatch.chdir(tmp_path)
    commands = doc_commands()
    assert [c[0] for c in commands] == ["train", "analyze"]
    for command in commands:
        assert main(command) == 0, capsys.readouterr().err
    run = tmp_path / "runs" / "leaky-tail"
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["plugins"] == [str((tmp_path / "my_ext.py").resolve())]
    assert config["schedule"] == "tailexact:4"
    assert config["model"]["memory"]["mechanism"] == "leaky"
    assert (run / "tables" / "contraction.csv").is_file()
    assert "plot: runs/leaky-tail/contraction.png" in capsys.readouterr().out

    # the model analyze rebuilt is the plugin's, and its schedule is exact at N = T
    from lrt_lab.analysis.loading import load_model
    from lrt_lab.run.runner import run_schedule

    model = load_model(run).double()
    assert type(model.pathway).__name__ == "Leaky" and model.pathway.leak.shape == ()
    idx = torch.randint(0, model.config.vocab_size, (2, 8))
    with torch.no_grad():
        tail = run_schedule(model, idx, None, "tailexact:8").logits
        exact = run_schedule(model, idx, None, "exact").logits
        four = run_schedule(model, idx, None, "tailexact:4").logits
    assert (tail - exact).abs().max() < 1e-10
    assert (four - exact).abs().max() > 1e-8  # fewer exact positions: not exact recurrence


def test_a_recorded_plugin_that_moved_is_named_with_the_route(tmp_path, monkeypatch, isolated):
    from lrt_lab.commands.cli import main

    write_doc_plugin(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(doc_commands()[0]) == 0
    config = tmp_path / "runs" / "leaky-tail" / "config.json"
    saved = json.loads(config.read_text())
    saved["train"]["plugins"] = [str(tmp_path / "elsewhere" / "my_ext.py")]
    config.write_text(json.dumps(saved))
    from lrt_lab.analysis.loading import load_run_plugins

    # my_ext.py is loaded already (the training above): it stands for the moved file
    assert load_run_plugins(config.parent) == (str((tmp_path / "my_ext.py").resolve()),)
    saved["train"]["plugins"] = [str(tmp_path / "elsewhere" / "other_ext.py")]
    config.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="which is not there: load it with --plugin FILE"):
        load_run_plugins(config.parent)


def test_a_sweep_spec_names_its_plugins(tmp_path, monkeypatch, capsys, isolated):
    from lrt_lab.commands.cli import main

    write_doc_plugin(tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[sweep]\ntasks = ["a5_prefix"]\nmodels = ["lrt"]\nschedules = ["tailexact:4"]\n'
        '[train]\nlength = 8\npreset = "tiny"\nsteps = 2\nbatch_size = 4\neval_lengths = [8]\n'
        'eval_size = 8\nplugins = ["my_ext.py"]\noverrides = { "memory.mechanism" = "leaky" }\n'
    )
    assert main(["sweep", str(spec), "--dry-run", "--out", "store"]) == 0, capsys.readouterr()
    assert "tailexact_4" in capsys.readouterr().out
    # without the plugin the same spec is refused, naming the route
    spec.write_text(spec.read_text().replace('plugins = ["my_ext.py"]\n', ""))
    registry.SCHEDULES.pop("tailexact")
    plugins._loaded.clear()
    assert main(["sweep", str(spec), "--dry-run", "--out", "store"]) == 2
    assert "--plugin FILE" in capsys.readouterr().err
    assert main(["sweep", str(spec), "--dry-run", "--out", "store", "--plugin", "my_ext.py"]) == 0
    # trained, the runs record the plugin given on the command line
    assert main(["sweep", str(spec), "--out", "store", "--plugin", "my_ext.py", "--quiet"]) == 0
    (config,) = (tmp_path / "store").glob("*/config.json")
    recorded = json.loads(config.read_text())["train"]["plugins"]
    assert recorded == [str((tmp_path / "my_ext.py").resolve())]


def test_the_bench_loads_its_plugins_before_reading_its_schedules(tmp_path, capsys, isolated):
    from lrt_lab.commands import bench
    from lrt_lab.commands.bench_args import parse

    path = write_doc_plugin(tmp_path)
    assert bench.run(parse(["--plugin", str(tmp_path / "missing.py")])) == 2
    assert "plugin=" in capsys.readouterr().err and "tailexact" not in registry.SCHEDULES
    # the plugin is imported, then the bad preset refuses the run before any timing
    assert bench.run(parse(["--plugin", str(path), "--preset", "nope"])) == 2
    assert "preset='nope' is invalid" in capsys.readouterr().err
    assert "tailexact" in registry.SCHEDULES


# No torch before a command runs ------------------------------------------------------------------
NO_TORCH = [  # (arguments, exit status): help, and errors in the arguments
    (["--help"], 0),
    (["train", "--help"], 0),
    (["sweep", "--help"], 0),
    (["report", "--help"], 0),
    (["demo", "--help"], 0),
    (["app", "--help"], 0),
    (["bench", "--help"], 0),
    (["analyze", "--help"], 0),
    (["analyze", "scaling", "--help"], 0),
    (["analyze", "contraction", "--help"], 0),
    (["train", "--steps", "-5"], 2),
    (["train", "--lr-scale", "nan"], 2),
    (["train", "--schedule", "nope"], 2),
    (["train", "--schedule", "interleaved:0"], 2),  # a built-in's spec refuses it: no torch
    (["train", "--schedule", "fullseq:2:1,1"], 2),
    (["sweep", "bad_schedule.toml", "--dry-run"], 2),  # written by the test below
    (["sweep", "bad_key.toml", "--dry-run"], 2),
    (["train", "--set", "memory.mechanism=leaky"], 2),
    (["train", "--set", "nokey"], 2),
    (["train", "--plugin", "missing_plugin.py"], 2),
    (["sweep", "nope.toml", "--dry-run"], 2),
    (["sweep", "nope.toml", "--workers", "0"], 2),
    (["bench", "--repeats", "x"], 2),
    (["report", "no_such_store"], 2),
    (["report", "no_such_store", "--study", "nope.toml"], 2),
    (["report", ".", "--study", "nope.toml"], 2),
    (["analyze", "scaling", "nope", "--plugin", "missing_plugin.py"], 2),
    (["analyze", "scaling"], 2),
    (["report", ".", "--out", "figures"], 2),
    (["analyze", "contraction", "no_such_run"], 2),
    (["analyze", "probe", "no_such_run", "--decoding", "exact"], 2),
    (["analyze", "gap", "no_such_store"], 2),
    (["train", "--threads", "0"], 2),
    (["demo", "--threads", "0"], 2),
]


def _refuse_in_one_interpreter(tmp_path, cases, module: str):
    """Run `cases` (arguments, exit status) through main in one fresh interpreter, checking each
    status and that `module` is not loaded after it; the finished process (it prints
    "LOADED False" at the end). The sweep specs the cases name are written first."""
    program = (
        "import sys\n"
        "from lrt_lab.commands.cli import main\n"
        f"cases = {cases!r}\n"
        "for argv, want in cases:\n"
        "    try:\n"
        "        got = main(argv)\n"
        "    except SystemExit as e:\n"
        "        got = e.code\n"
        "    assert got == want, (argv, got, want)\n"
        f"    assert {module!r} not in sys.modules, argv\n"
        f"print('LOADED', {module!r} in sys.modules)\n"
    )
    grid = '[sweep]\ntasks = ["a5_prefix"]\nmodels = ["lrt"]\n'
    (tmp_path / "bad_schedule.toml").write_text(grid + 'schedules = ["interleaved:0"]\n')
    (tmp_path / "bad_key.toml").write_text(grid + "bogus = 1\n")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}  # chosen: no CPU sample before each
    return subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_help_and_argument_errors_load_no_torch(tmp_path):
    """Every --help and every refusal of an argument above, in one fresh interpreter: torch is
    not among its modules at the end (so none of them waited for it to load)."""
    done = _refuse_in_one_interpreter(tmp_path, NO_TORCH, "torch")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED False" in done.stdout
    assert done.stderr.count("error:") == sum(want == 2 for _, want in NO_TORCH), done.stderr


def test_refusals_of_train_and_sweep_arguments_load_no_pandas(tmp_path):
    """The argument errors of train and sweep above refuse before pandas loads as well (about
    half a second of a refusal's second, through the store's readers)."""
    cases = [(a, w) for a, w in NO_TORCH if a[0] in ("train", "sweep") and w == 2]
    done = _refuse_in_one_interpreter(tmp_path, cases, "pandas")
    assert done.returncode == 0 and "LOADED False" in done.stdout, done.stderr[-3000:]
    assert done.stderr.count("error:") == len(cases), done.stderr


def test_a_valid_command_does_load_torch(tmp_path):
    """The check above can fail: a command that runs imports torch in the same interpreter."""
    program = (
        "import sys\n"
        "from lrt_lab.commands.cli import main\n"
        "main(['train', '--schedule', 'interleaved:9', '--length', '8'])\n"  # S > T: on the model
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "TORCH True" in done.stdout, done.stderr[-2000:]


# Reports write nothing into the store ------------------------------------------------------------
def snapshot(root: Path) -> dict:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    } | {str(p.relative_to(root)) + "/": None for p in root.rglob("*") if p.is_dir()}


def test_a_study_report_leaves_a_copy_of_the_store_untouched(tmp_path, monkeypatch, capsys):
    from lrt_lab.commands.cli import main
    from tests.test_study import SPEC
    from tests.test_study_curves import curves_store

    store = shutil.copytree(curves_store(tmp_path / "built"), tmp_path / "copy")
    spec = tmp_path / "curved.toml"
    spec.write_text(SPEC)
    before = snapshot(store)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["report", str(store), "--study", str(spec)]) == 0
    figure = Path("outputs") / "copy" / "curves_curved.png"
    assert f"{figure}" in capsys.readouterr().out and (work / figure).stat().st_size > 5_000
    assert main(["report", str(store), "--study", str(spec), "--out", "given"]) == 0
    assert (work / "given" / "curves_curved.png").is_file()
    assert snapshot(store) == before


@pytest.mark.slow
def test_analyze_scaling_leaves_a_copy_of_the_store_untouched(tmp_path, monkeypatch, capsys):
    from scaling_store import build

    from lrt_lab.commands.cli import main

    build(tmp_path / "built", lambda r, s: -0.02 + 0.002 * s, seeds=(0, 1))
    store = shutil.copytree(tmp_path / "built", tmp_path / "scaling_copy")
    before = snapshot(store)
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "scaling", str(store)]) == 0
    out = tmp_path / "outputs" / "scaling_copy"
    assert (out / "scaling_bpb_exact_C.png").is_file()
    assert (out / "tables" / "scaling_fits.csv").is_file()
    assert f"plot: {Path('outputs') / 'scaling_copy' / 'scaling_bpb_exact_C.png'}" in (
        capsys.readouterr().out
    )
    assert snapshot(store) == before


def test_a_study_report_parses_each_metrics_file_once(tmp_path, monkeypatch):
    """reading_once: every reader gets the records, the file is parsed once while it stays the
    same, again once it changes, and nothing is kept outside the block."""
    from lrt_lab.store import results

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "eval", "step": 1}\n{"kind": "train", "step": 1, "loss": 2.0}\n')
    parsed = []
    parse = results._parse_jsonl
    monkeypatch.setattr(
        results, "_parse_jsonl", lambda p, kind=None: parsed.append(p) or parse(p, kind)
    )
    with results.reading_once():
        first, _ = results._read_jsonl(path)
        second, _ = results._read_jsonl(path)
        assert first == second and first is not second and len(parsed) == 1
        # one kind, from the records parsed already
        assert results._read_jsonl(path, "eval") == ([first[0]], 0) and len(parsed) == 1
        with path.open("a") as f:
            f.write('{"kind": "eval", "step": 2}\n')
        assert [r["step"] for r in results._read_jsonl(path)[0]] == [1, 1, 2]
        assert len(parsed) == 2
    results._read_jsonl(path)
    results._read_jsonl(path)
    assert len(parsed) == 4
