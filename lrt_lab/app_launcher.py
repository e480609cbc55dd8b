"""`lrt-lab app`: start the Streamlit dashboard (the `app` package) over a run store.

lrt_lab never imports `app` (arrows point one way): the app's file is located with
importlib.util.find_spec, which finds a top-level package without importing it, and handed to
`streamlit run` in a child process.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

APP_FILE = "streamlit_app.py"
MISSING_STREAMLIT = "lrt-lab app needs streamlit: pip install -e '.[app]'"


def app_path() -> Path:
    """app/streamlit_app.py of the installed (or checked-out) `app` package."""
    spec = importlib.util.find_spec("app")
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(loc) / APP_FILE
        if path.is_file():
            return path.resolve()
    # A source checkout run without installing: app/ sits next to lrt_lab/.
    path = Path(__file__).resolve().parent.parent / "app" / APP_FILE
    if path.is_file():
        return path
    raise FileNotFoundError(f"app: cannot find the dashboard ({APP_FILE} of the `app` package); "
                            "reinstall with pip install -e '.[app]'")


def command(runs_dir: str | None, port: int, address: str | None = None, headless: bool | None = None) -> list[str]:
    """The `streamlit run` command line for the dashboard (also used by the browser test)."""
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"port={port!r} is invalid; allowed: an integer in 1..65535")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app_path()), "--server.port", str(port),
           "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    if address:
        cmd += ["--server.address", address]
    if headless is not None:
        cmd += ["--server.headless", "true" if headless else "false"]
    if runs_dir:
        cmd += ["--", "--runs", str(runs_dir)]
    return cmd


def launch(runs_dir: str | None, port: int) -> int:
    """Run the dashboard until it is stopped (Ctrl-C); returns streamlit's exit status.

    runs_dir None lets the app choose ($LRT_RUNS, else ./runs, else ./results)."""
    if importlib.util.find_spec("streamlit") is None:
        print(MISSING_STREAMLIT, file=sys.stderr)
        return 1
    cmd = command(runs_dir, port)
    print(f"lrt-lab app: http://localhost:{port} (run store: {runs_dir or 'default'}; Ctrl-C stops it)",
          file=sys.stderr)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:  # the child got the same Ctrl-C and stops on its own
        return 0
