"""`lrt-lab app`: start the Streamlit dashboard (the `app` package) over a run store.

lrt_lab never imports `app` (arrows point one way): the app's file is located with
importlib.util.find_spec, which finds a top-level package without importing it, and handed to
`streamlit run` in a child process.
"""

from __future__ import annotations

import ctypes
import importlib.util
import signal
import socket
import subprocess
import sys
from pathlib import Path

APP_FILE = "streamlit_app.py"
MISSING_STREAMLIT = "lrt-lab app needs streamlit: pip install -e '.[app]'"
# Only this machine reaches the dashboard unless `lrt-lab app --address` says otherwise (Streamlit
# itself listens on every interface).
LOCAL_ADDRESS = "127.0.0.1"


def app_path() -> Path:
    """app/streamlit_app.py of the installed (or checked-out)
    `lrt_app` package (the app/ folder)."""
    spec = importlib.util.find_spec("lrt_app")
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(loc) / APP_FILE
        if path.is_file():
            return path.resolve()
    # A source checkout run without installing: app/ sits next to lrt_lab/.
    path = Path(__file__).resolve().parent.parent / "app" / APP_FILE
    if path.is_file():
        return path
    raise FileNotFoundError(
        f"app: cannot find the dashboard ({APP_FILE} of the `app` package); "
        "reinstall with pip install -e '.[app]'"
    )


def command(
    runs_dir: str | None,
    port: int,
    address: str = LOCAL_ADDRESS,
    headless: bool | None = None,
    allow_roots=(),
) -> list[str]:
    """The `streamlit run` command line for the dashboard (also used by the browser test),
    listening on `address` only (127.0.0.1: this machine); `allow_roots`: more folders its
    sidebar may open besides the store it starts on."""
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"port={port!r} is invalid; allowed: an integer in 1..65535")
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app_path()),
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
    ]
    if not isinstance(address, str) or not address:
        raise ValueError(f"address={address!r} is invalid; allowed: a host address, e.g. 0.0.0.0")
    cmd += ["--server.address", address]
    if headless is not None:
        cmd += ["--server.headless", "true" if headless else "false"]
    app_args = [x for root in allow_roots for x in ("--allow-root", str(root))]
    if runs_dir:
        app_args += ["--runs", str(runs_dir)]
    return cmd + (["--", *app_args] if app_args else [])


def port_is_free(port: int, host: str = "") -> bool:
    """Whether a server could listen on `port` at `host` ("": every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(start: int, tries: int = 50) -> int | None:
    """The first free port after `start` (None if `tries` ports in a row are taken)."""
    for port in range(start + 1, min(start + 1 + tries, 65536)):
        if port_is_free(port):
            return port
    return None


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it when its parent dies, even by SIGKILL
    (prctl PR_SET_PDEATHSIG); elsewhere the parent's own cleanup below is what stops it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def launch(runs_dir: str | None, port: int, address: str = LOCAL_ADDRESS, allow_roots=()) -> int:
    """Run the dashboard until it is stopped (Ctrl-C or SIGTERM); returns streamlit's exit status.

    runs_dir None lets the app choose ($LRT_RUNS, else ./runs, else ./results). It listens on
    `address` (this machine only by default; "0.0.0.0" exposes it to every host that reaches this
    one, said when it starts). A busy port is reported with a free one to use instead (exit status
    2), before anything starts. The `streamlit run` child ends with this process however it
    ends."""
    if importlib.util.find_spec("streamlit") is None:
        print(MISSING_STREAMLIT, file=sys.stderr)
        return 1
    cmd = command(runs_dir, port, address, allow_roots=allow_roots)
    if not port_is_free(port, "" if address == "0.0.0.0" else address):
        other = free_port(port)
        hint = f"; try lrt-lab app --port {other}" if other else "; pass another one with --port"
        print(
            f"lrt-lab app: port {port} is already in use (another dashboard?){hint}",
            file=sys.stderr,
        )
        return 2
    host = "localhost" if address == LOCAL_ADDRESS else address
    print(
        f"lrt-lab app: http://{host}:{port} (run store: {runs_dir or 'default'}; Ctrl-C stops it)",
        file=sys.stderr,
    )
    if address != LOCAL_ADDRESS:
        print(
            f"lrt-lab app: listening on {address}: every host that reaches it can read the store",
            file=sys.stderr,
        )
    child = subprocess.Popen(
        cmd, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None
    )
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return child.wait()
    except KeyboardInterrupt:  # the child got the same Ctrl-C; wait for it below
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
