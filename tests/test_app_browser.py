"""The dashboard in a real browser: `streamlit run` on 127.0.0.1, headless Chromium through selenium.

Needs the Debian packages `chromium` and `chromium-driver` (.ci/run installs them when missing);
skipped, saying why, where they are not installed. The screenshot is saved to the path the test
prints (and into the test's tmp_path), so a person can look at what the browser drew.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOT = Path(os.environ.get("LRT_SCREENSHOT_DIR", tempfile.gettempdir())) / "lrt_lab_app_screenshot.png"
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1500,1000"]

pytestmark = pytest.mark.slow


def _require_browser():
    pytest.importorskip("streamlit")
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[app]')")
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            pytest.skip(f"{path} not found: install the Debian package {package} (.ci/run does where it can)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """`streamlit run` (through lrt_lab.app_launcher's command) over a fresh tiny store; always stopped."""
    _require_browser()
    from lrt_lab.app_launcher import command
    from test_app import LRT_RUNS, TRANSFORMER_RUN, build_store

    store = build_store(tmp_path / "store", analysis=False, lrt_seeds=(0,))
    port = _free_port()
    log = open(tmp_path / "streamlit.log", "w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    proc = subprocess.Popen(command(str(store), port, address="127.0.0.1", headless=True), stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with {proc.returncode}:\n{(tmp_path / 'streamlit.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit did not answer on {url} within 60 s")
            time.sleep(0.3)
        yield url, [LRT_RUNS[0], TRANSFORMER_RUN]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.fixture
def browser(tmp_path):
    _require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS + [f"--user-data-dir={tmp_path / 'chrome-profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_dashboard_in_chromium(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, runs = server
    browser.set_page_load_timeout(60)
    browser.get(url)
    wait = WebDriverWait(browser, 60, poll_frequency=0.25)
    # The page streams in over a websocket: wait for the runs table (a canvas grid), the run names
    # written as text under it, and for the script to finish (Streamlit's "Running..." widget gone).
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]'))
    wait.until(lambda d: all(name in d.find_element(By.TAG_NAME, "body").text for name in runs))
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]'))
    time.sleep(1.0)  # let the grid paint its canvas before the screenshot
    text = browser.find_element(By.TAG_NAME, "body").text
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
    shutil.copy(SCREENSHOT, tmp_path / SCREENSHOT.name)
    print(f"\nscreenshot: {SCREENSHOT} (and {tmp_path / SCREENSHOT.name})")
    assert "lrt_lab runs" in text
    for tab in ("Runs", "Training curves", "Length generalisation", "Probes"):
        assert tab in text
    assert "Traceback" not in text and "could not be drawn" not in text
    assert all(name in text for name in runs)
