import os

# Under pytest-xdist each worker gets one torch thread: two workers with two OpenMP threads each
# on two cores oversubscribe them, and a small model then runs several times slower (the threads
# spin at every barrier for one that is not running). Set before torch is imported, so libgomp
# and subprocesses the tests start read it too; a user's own OMP_NUM_THREADS wins.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_addoption(parser):
    parser.addoption(
        "--memory-plugin",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="load a file or module that registers a memory mechanism "
        "(lrt_lab.register_memory) before collection, so the generated "
        "invariant tests (tests/test_invariants.py) cover it",
    )


@pytest.fixture(autouse=True)
def _core_claims_of_its_own(tmp_path_factory, monkeypatch):
    """Each test claims CPU cores (lrt_lab.training.threads) in a folder of its own, so the
    lrt_lab processes of other work on the machine do not change the threads a test expects."""
    monkeypatch.setenv("LRT_LAB_CORE_CLAIMS", str(tmp_path_factory.mktemp("cores")))


@pytest.fixture(scope="session")
def ray_instance():
    """One local Ray instance for the whole test run (starting one takes 10-30 s on a loaded 2-core
    machine): run_on_ray uses an instance already running in the process and leaves it running,
    and a driver in a subprocess joins it by its address. Its tests carry
    xdist_group("ray"), so one pytest-xdist worker runs them all and starts it once. Started as a
    sweep's driver starts one (lrt_lab.training.parallel.init_local_ray: its waits, and a second
    try where the node timed out during start-up on a loaded machine)."""
    ray = pytest.importorskip("ray")
    from lrt_lab.training.parallel import init_local_ray

    init_local_ray(
        ray,
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
    )
    yield ray
    ray.shutdown()


def pytest_configure(config):
    # as `--plugin` loads them (lrt_lab.core.plugins): a file as a real module, in sys.modules
    # before its code runs, so `@dataclass` under `from __future__ import annotations` works
    from lrt_lab.core.plugins import load_plugin

    for plugin in config.getoption("--memory-plugin"):
        try:
            load_plugin(plugin)
        except ValueError as e:
            raise pytest.UsageError(f"--memory-plugin {plugin}: {e}") from None


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
