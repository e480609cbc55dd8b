"""The dashboard in a real browser: `streamlit run` on 127.0.0.1, headless Chromium through
selenium,
in a 1400 px window.

Needs the Debian packages `chromium` and `chromium-driver` (make test installs them when missing, as
root with apt-get);
skipped, saying why, where they are not installed. Every tab is screenshotted into
$LRT_SCREENSHOT_DIR (default: the system temp folder) and the test's tmp_path, so a person can look
at what the browser drew: on a small store of several groups, and on the committed
`experiments/results/`.
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
SCREENSHOTS = (
    Path(os.environ.get("LRT_SCREENSHOT_DIR", tempfile.gettempdir())) / "lrt_lab_app_screenshots"
)
WINDOW = (1400, 1000)
CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
]
TABS = [
    "Compare",
    "Runs",
    "Training curves",
    "Length generalisation",
    "Depth x length",
    "Gap recovery",
    "Probes",
    "Convergence",
    "Trainer frontier",
]
COMMITTED_STORE = Path(__file__).resolve().parent.parent / "experiments" / "results"

# one worker under `pytest -n 2 --dist loadgroup`, so both tests share the module's Chromium
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("app_browser")]


def _require_browser():
    pytest.importorskip("streamlit")
    pytest.importorskip(
        "selenium", reason="selenium is not installed (pip install -e '.[dev]', or make test)"
    )
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            pytest.skip(
                f"{path} not found: install the Debian package {package} (make test does where it "
                "can)"
            )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(store: Path, tmp_path: Path):
    """`streamlit run` (through lrt_lab.commands.app_launcher's command) over `store`; yields its
    URL, always stopped."""
    from lrt_lab.commands.app_launcher import command

    port = _free_port()
    log = open(tmp_path / "streamlit.log", "w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    proc = subprocess.Popen(
        command(str(store), port, address="127.0.0.1", headless=True),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"streamlit exited with {proc.returncode}:\n"
                    f"{(tmp_path / 'streamlit.log').read_text()}"
                )
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit did not answer on {url} within 60 s")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def several_groups(root: Path) -> Path:
    """Tiny real runs in three groups: LRT Interleaved(2) x 2 seeds, a transformer, and the LRT
    trained exactly with its memory from block 2, x 2 seeds (each a second or two)."""
    from app_helpers import build_store

    from lrt_lab.training.loop import TrainConfig, train

    build_store(root, analysis=False, lrt_seeds=(0, 1))
    for seed in (0, 1):
        cfg = TrainConfig(
            task="group_prefix",
            task_options={"group": "S3", "curriculum_start": 3, "curriculum_steps": 4},
            length=6,
            preset="tiny",
            model="lrt",
            schedule="exact",
            steps=6,
            batch_size=8,
            eval_every=3,
            eval_lengths=(6, 12),
            eval_size=16,
            checkpoint_every=0,
            seed=seed,
            overrides={"memory.source_layer": 2},
        )
        train(cfg, out=root, progress=False)
    return root


@pytest.fixture
def server(tmp_path):
    _require_browser()
    store = several_groups(tmp_path / "store")
    yield from _serve(store, tmp_path)


@pytest.fixture
def committed_server(tmp_path):
    _require_browser()
    if not (COMMITTED_STORE / "README.md").exists():
        pytest.skip(f"no committed run store at {COMMITTED_STORE}")
    yield from _serve(COMMITTED_STORE, tmp_path)


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    """One Chromium for the module (starting one costs seconds of CPU); tests take it through
    `browser`, which hands it over at the window size with no console messages left over."""
    _require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console messages, for errors
    profile = tmp_path_factory.mktemp("chrome-profile")
    for flag in CHROME_FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium):
    chromium.set_window_size(*WINDOW)
    chromium.get("about:blank")
    chromium.get_log("browser")  # read, so a test sees only its own page's messages
    return chromium


# Driving the page -------------------------------------------------------------------------------
def _body(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def _until(what: str, condition, timeout: float = 90, poll: float = 0.1):
    """condition()'s first truthy value, polled; a test failure naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


def _drawn(driver, panel=None) -> bool:
    """Every chart shown has drawn its canvas (or svg) at a size, and the page is not running."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        if driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]'):
            return False
        # the status widget shows only after a delay: ask the app itself whether its script runs
        if not driver.find_elements(
            By.CSS_SELECTOR, '[data-testid="stApp"][data-test-script-state="notRunning"]'
        ):
            return False
        for chart in _charts(panel if panel is not None else driver):
            marks = chart.find_elements(By.CSS_SELECTOR, "canvas, svg.marks")
            if not marks or not all(m.size["width"] > 0 and m.size["height"] > 0 for m in marks):
                return False
    except StaleElementReferenceException:  # redrawn while we looked
        return False
    return True


def _settle(driver, panel=None) -> None:
    """Wait for the script run to finish (Streamlit's status widget gone) and Vega to draw: the
    same condition twice in a row, a poll apart, so a rerun just starting is not taken for done."""
    _until(
        "the page to finish running and draw",
        lambda: _drawn(driver, panel) and (time.sleep(0.3) or _drawn(driver, panel)),
    )


def _open(driver, url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.set_page_load_timeout(60)
    driver.get(url)
    WebDriverWait(driver, 90, poll_frequency=0.1).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
    )
    _settle(driver)


def _tab(driver, title: str):
    """Click a tab; returns its panel."""
    from selenium.webdriver.common.by import By

    def tab():
        (found,) = [
            t
            for t in driver.find_elements(By.CSS_SELECTOR, '[role="tab"]')
            if t.text.strip() == title
        ]
        return found

    tab().click()
    # the selected tab's only
    panel = driver.find_element(By.ID, tab().get_attribute("aria-controls"))
    _settle(driver, panel)
    return panel


def _charts(panel) -> list:
    from selenium.webdriver.common.by import By

    return [
        c
        for c in panel.find_elements(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"]')
        if c.is_displayed()
    ]


def _chart_image(driver, panel) -> bytes:
    charts = _charts(panel)
    assert charts, "no chart drawn"
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", charts[0])
    _settle(driver, panel)
    return charts[0].screenshot_as_png


def _redrawn(driver, title: str, before: bytes, what: str) -> tuple[object, bytes]:
    """(panel, chart image) of tab `title` once its chart differs from `before`; fails after 30 s
    with `what` if it never does (a control the chart ignores)."""

    def changed():
        panel = _tab(driver, title)
        image = _chart_image(driver, panel)
        if image == before:
            return None
        # the same image again a moment later: the chart drawn, not a frame of a rerun under way
        time.sleep(0.3)
        panel = _tab(driver, title)
        return (panel, image) if _chart_image(driver, panel) == image else None

    return _until(what, changed, timeout=30, poll=0.3)


def _console_errors(driver) -> list[str]:
    return [
        e["message"]
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "favicon" not in e["message"]
    ]


def _screenshot_every_tab(driver, name: str, tmp_path: Path) -> dict[str, str]:
    """Full-page screenshots of every tab (the window grows to the page's height); {tab: text}."""
    from selenium.webdriver.common.by import By

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    texts = {}
    for title in TABS:
        panel = _tab(driver, title)
        texts[title] = panel.text
        height = driver.execute_script(
            "return Math.max(...Array.from(document.querySelectorAll('section, div'), e => "
            "e.scrollHeight))"
        )
        driver.set_window_size(WINDOW[0], min(max(WINDOW[1], int(height) + 120), 6000))
        time.sleep(0.3)  # the resize's relayout
        _settle(driver, panel)
        file = SCREENSHOTS / f"{name}-{title.lower().replace(' ', '_')}.png"
        assert driver.save_screenshot(str(file))
        shutil.copy(file, tmp_path / file.name)
        driver.set_window_size(*WINDOW)
        # nothing drawn wider than the window: facets wrap, legends sit under their chart
        widths = [
            c.size["width"]
            for c in panel.find_elements(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"]')
        ]
        assert all(w <= WINDOW[0] for w in widths), (title, widths)
    print(f"\nscreenshots: {SCREENSHOTS}/{name}-*.png (and {tmp_path})")
    return texts


# The tests ---------------------------------------------------------------------------------------
def test_charts_follow_every_control(server, browser, tmp_path):
    """Smoothing and a filter that keeps the same groups (seed = 0) must redraw the chart: once,
    both left it pixel-identical while the console said `Unrecognized data set: runs`."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _open(browser, server)
    text = _body(browser)
    assert "lrt_lab runs" in text and "Traceback" not in text
    panel = _tab(browser, "Training curves")
    before = _chart_image(browser, panel)

    slider = panel.find_element(By.CSS_SELECTOR, '[data-testid="stSlider"] input[type="range"]')
    browser.execute_script("arguments[0].focus();", slider)
    ActionChains(browser).send_keys(Keys.END).perform()  # smoothing 0 -> 0.99
    panel, smoothed = _redrawn(
        browser, "Training curves", before, "the chart to follow the smoothing slider"
    )
    assert (
        panel.find_element(
            By.CSS_SELECTOR, '[data-testid="stSlider"] input[type="range"]'
        ).get_attribute("value")
        == "0.99"
    )

    (seed,) = [
        m
        for m in browser.find_elements(
            By.CSS_SELECTOR, '[data-testid="stSidebar"] [data-testid="stMultiSelect"]'
        )
        if m.text.splitlines()[0].strip() == "seed"
    ]
    box = seed.find_element(By.TAG_NAME, "input")
    box.click()
    box.send_keys("0", Keys.ENTER, Keys.ESCAPE)
    _redrawn(browser, "Training curves", smoothed, "the chart to follow the seed filter")
    assert not _console_errors(browser), _console_errors(browser)

    texts = _screenshot_every_tab(browser, "several_groups", tmp_path)
    for title, text in texts.items():
        assert "could not be drawn" not in text and "Traceback" not in text, title
    assert not _console_errors(browser), _console_errors(browser)


def test_every_tab_on_the_committed_store(committed_server, browser, tmp_path):
    _open(browser, committed_server)
    texts = _screenshot_every_tab(browser, "results", tmp_path)
    for title, text in texts.items():
        assert "could not be drawn" not in text and "Traceback" not in text, title
    assert (
        "Gap recovery" in texts["Gap recovery"]
        and "Train/inference mismatch" in texts["Gap recovery"]
    )
    assert "No run shown has BPB tables" not in texts["Gap recovery"]
    assert (
        "lrt fixedpoint:0.01:16" in texts["Trainer frontier"]
        and "exact pos@90 at 16" in texts["Trainer frontier"]
    )
    # the dashboard opens on the most recent study, its methods in short labels
    assert (
        "Methods: a5_prefix at length 16" in texts["Compare"]
        and "Trainer frontier" in texts["Compare"]
    )
    assert not _console_errors(browser), _console_errors(browser)
