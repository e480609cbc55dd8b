"""The dashboard in a real browser: `streamlit run` on 127.0.0.1, headless Chromium through
selenium,
in a 1400 px window.

Needs the Debian packages `chromium` and `chromium-driver` (make test installs them when missing, as
root with apt-get);
skipped, saying why, where they are not installed. Every tab is screenshotted into
$LRT_SCREENSHOT_DIR (default: the system temp folder) and the test's tmp_path, so a person can look
at what the browser drew: on a small store of several groups, and on the committed
`experiments/results/`. With $LRT_DOCS_SCREENSHOTS set to a folder (docs/screenshots), the committed
store's tabs are also written there as small PNGs (palette colours, at most DOCS_HEIGHT px tall):

    LRT_DOCS_SCREENSHOTS=docs/screenshots pytest -n 0 tests/test_app_browser.py -k committed
    (the Scaling tab's from the committed scaling store, experiments/scaling_runs/)

On every tab of the committed store at 1400 px the page does not scroll sideways, and every chart
(drawn as SVG) has its legends inside it and a plot at least as tall as any of its legends.
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
from helpers import tiny_train_config

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOTS = (
    Path(os.environ.get("LRT_SCREENSHOT_DIR", tempfile.gettempdir())) / "lrt_lab_app_screenshots"
)
DOCS_SCREENSHOTS = os.environ.get("LRT_DOCS_SCREENSHOTS")
DOCS_HEIGHT = 2400
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
    "Delta",
    "Length generalisation",
    "Depth x length",
    "Gap recovery",
    "Probes",
    "Convergence",
    "Trainer frontier",
    "Scaling",
]
COMMITTED_STORE = Path(__file__).resolve().parent.parent / "experiments" / "results"
SCALING_STORE = COMMITTED_STORE.parent / "scaling_runs"

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

    from lrt_lab.training.loop import train

    build_store(root, analysis=False, lrt_seeds=(0, 1))
    for seed in (0, 1):
        cfg = tiny_train_config(
            task_options={"group": "S3", "curriculum_start": 3, "curriculum_steps": 4},
            steps=6,
            eval_every=3,
            eval_lengths=(6, 12),
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


@pytest.fixture
def scaling_server(tmp_path):
    _require_browser()
    if not (SCALING_STORE / "README.md").exists():
        pytest.skip(f"no committed scaling store at {SCALING_STORE}")
    yield from _serve(SCALING_STORE, tmp_path)


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


# What the page and each chart measure in the browser: the page's scroll width, anything else that
# scrolls sideways (tables scroll inside their own frame, by design), and for every chart (an SVG
# drawn by Vega) its size, its plot (the view's frame, or the union of a facet's cells) and its
# legends, relative to the chart's top left.
LAYOUT_JS = """
const panel = arguments[0];
const doc = document.documentElement;
const inTable = e => e.closest('[data-testid="stDataFrame"], [data-testid="stTable"]');
const sideways = Array.from(document.querySelectorAll('*'))
  .filter(e => e.scrollWidth > e.clientWidth + 1 && !inTable(e)
    && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
  .map(e => (e.getAttribute('data-testid') || e.tagName) + ': ' + e.scrollWidth + ' > '
    + e.clientWidth);
const charts = Array.from(panel.querySelectorAll('[data-testid="stVegaLiteChart"]'))
  .filter(c => c.offsetParent !== null)
  .map(c => {
    const svg = c.querySelector('svg.marks');
    if (!svg) return {svg: false};
    const box = svg.getBoundingClientRect();
    const rel = r => ({left: r.left - box.left, top: r.top - box.top, right: r.right - box.left,
      bottom: r.bottom - box.top, width: r.width, height: r.height});
    const frame = Array.from(svg.querySelectorAll(
      'g.role-frame.root > g > path.background, g.role-scope.cell > g > path.background'))
      .map(p => p.getBoundingClientRect()).filter(r => r.height > 0);
    const plot = frame.length ? {top: Math.min(...frame.map(r => r.top)) - box.top,
      bottom: Math.max(...frame.map(r => r.bottom)) - box.top} : null;
    return {svg: true, width: box.width, height: box.height, right: box.right,
      title: (c.closest('[data-testid="stVerticalBlock"]') || c).innerText.slice(0, 60),
      plot: plot && {...plot, height: plot.bottom - plot.top},
      legends: Array.from(svg.querySelectorAll('g.role-legend'))
        .map(l => rel(l.getBoundingClientRect())).filter(r => r.height > 0)};
  });
return {scrollWidth: doc.scrollWidth, clientWidth: doc.clientWidth, sideways, charts};
"""


def layout_problems(layout: dict, window_width: int) -> list[str]:
    """What LAYOUT_JS found wrong: a page wider than the window, something else scrolling
    sideways, a chart past the window or not drawn as SVG, a legend cut by its chart, a plot
    shorter than a legend (a flat line over a long list)."""
    problems = []
    if layout["scrollWidth"] > layout["clientWidth"]:
        problems.append(f"page scrolls sideways: {layout['scrollWidth']} > {layout['clientWidth']}")
    problems += [f"scrolls sideways: {s}" for s in layout["sideways"]]
    for i, chart in enumerate(layout["charts"]):
        if not chart["svg"]:
            problems.append(f"chart {i}: not drawn as SVG")
            continue
        if chart["right"] > window_width + 1:
            problems.append(f"chart {i}: ends at {chart['right']:.0f} px, past the window")
        if chart["plot"] is None:
            problems.append(f"chart {i}: no plot frame found")
            continue
        for legend in chart["legends"]:
            if legend["right"] > chart["width"] + 1 or legend["bottom"] > chart["height"] + 1:
                problems.append(
                    f"chart {i}: a legend is cut ({legend} in {chart['width']:.0f} x "
                    f"{chart['height']:.0f})"
                )
            if legend["height"] > chart["plot"]["height"] + 1:
                problems.append(
                    f"chart {i}: a legend {legend['height']:.0f} px tall over a plot "
                    f"{chart['plot']['height']:.0f} px tall"
                )
    return problems


def _docs_screenshot(png: bytes, file: Path) -> None:
    """A tab's screenshot for docs/: the top DOCS_HEIGHT px, in 256 colours (a few hundred KB)."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    image = image.crop((0, 0, image.width, min(image.height, DOCS_HEIGHT)))
    file.parent.mkdir(parents=True, exist_ok=True)
    # maximum coverage keeps the charts' small patches of colour (legend dots, points) true;
    # median cut, tuned to the large areas, merged some of them into one colour
    image.quantize(colors=256, method=Image.Quantize.MAXCOVERAGE).save(file, optimize=True)


def _screenshot_every_tab(
    driver, name: str, tmp_path: Path, docs: str | None = None, tabs=TABS, docs_tabs=TABS
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Full-page screenshots of every tab (the window grows to the page's height), and into `docs`
    the small ones of `docs_tabs`; ({tab: text}, {tab: layout problems at the window's width})."""
    from selenium.webdriver.common.by import By

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    texts, problems = {}, {}
    for title in tabs:
        panel = _tab(driver, title)
        texts[title] = panel.text
        problems[title] = layout_problems(driver.execute_script(LAYOUT_JS, panel), WINDOW[0])
        height = driver.execute_script(
            "return Math.max(...Array.from(document.querySelectorAll('section, div'), e => "
            "e.scrollHeight))"
        )
        driver.set_window_size(WINDOW[0], min(max(WINDOW[1], int(height) + 120), 6000))
        time.sleep(0.3)  # the resize's relayout
        _settle(driver, panel)
        slug = title.lower().replace(" ", "_")
        file = SCREENSHOTS / f"{name}-{slug}.png"
        png = driver.get_screenshot_as_png()
        file.write_bytes(png)
        shutil.copy(file, tmp_path / file.name)
        if docs and title in docs_tabs:
            _docs_screenshot(png, Path(docs) / f"{slug}.png")
        driver.set_window_size(*WINDOW)
        # nothing drawn wider than the window: facets wrap, legends sit under their chart
        widths = [
            c.size["width"]
            for c in panel.find_elements(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"]')
        ]
        assert all(w <= WINDOW[0] for w in widths), (title, widths)
    print(f"\nscreenshots: {SCREENSHOTS}/{name}-*.png (and {tmp_path})")
    return texts, problems


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
    # the page opens on the task's own figure; smoothing is for the training loss: pick it
    (metric,) = [
        m
        for m in panel.find_elements(By.CSS_SELECTOR, '[data-testid="stSelectbox"]')
        if m.text.splitlines()[0].strip() == "metric"
    ]
    assert "loss" not in metric.text.splitlines()[-1]
    before = _chart_image(browser, panel)
    box = metric.find_element(By.TAG_NAME, "input")
    box.click()
    box.send_keys("loss", Keys.ENTER)
    panel, before = _redrawn(browser, "Training curves", before, "the chart to show the loss")

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

    texts, _ = _screenshot_every_tab(browser, "several_groups", tmp_path)
    for title, text in texts.items():
        assert "could not be drawn" not in text and "Traceback" not in text, title
    assert not _console_errors(browser), _console_errors(browser)


def test_every_tab_on_the_committed_store(committed_server, browser, tmp_path):
    """About a hundred runs in some fifty groups: every tab fits a 1400 px window, and every chart's
    plot stays at least as tall as its legends."""
    _open(browser, committed_server)
    # the Scaling tab's docs picture comes from the scaling store (the test after this one)
    docs_tabs = [t for t in TABS if t != "Scaling"]
    texts, problems = _screenshot_every_tab(
        browser, "results", tmp_path, DOCS_SCREENSHOTS, docs_tabs=docs_tabs
    )
    for title, text in texts.items():
        assert "could not be drawn" not in text and "Traceback" not in text, title
    assert not any(problems.values()), {t: p for t, p in problems.items() if p}
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


def test_the_scaling_tab_on_the_committed_scaling_store(scaling_server, browser, tmp_path):
    """The grid's own store: the figure, the deltas and the decision, which waits for the seeds
    the grid's recorded plan names."""
    _open(browser, scaling_server)
    texts, problems = _screenshot_every_tab(
        browser, "scaling", tmp_path, DOCS_SCREENSHOTS, tabs=["Scaling"]
    )
    text = texts["Scaling"]
    assert "Decision" in text and "seeds the grid plans" in text, text[:2000]
    assert "No run shown was trained to a budget" not in text and "Traceback" not in text
    assert not problems["Scaling"], problems
    assert not _console_errors(browser), _console_errors(browser)


def test_every_group_at_once_on_the_committed_store(committed_server, browser, tmp_path):
    """The page that once collapsed to a flat line under a legend of 48 groups: every group picked
    (the picker's *Select all*), the plots grow with their legends and nothing scrolls sideways."""
    from selenium.common.exceptions import (
        ElementNotInteractableException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _open(browser, committed_server)
    title = "Length generalisation"
    panel = _tab(browser, title)
    panel.find_element(By.CSS_SELECTOR, '[data-testid="stExpander"] summary').click()

    def open_picker() -> bool:  # once the expander has finished opening
        try:
            panel.find_element(
                By.CSS_SELECTOR, '[data-testid="stExpander"] [data-testid="stMultiSelect"] input'
            ).click()
        except (ElementNotInteractableException, StaleElementReferenceException):
            return False
        return True

    _until("the group picker to open", open_picker, timeout=30, poll=0.3)

    def option_texts():
        # the list re-renders while it opens: read every text in the same poll that found the
        # options, and try again when one went stale in between
        try:
            found = browser.find_elements(By.XPATH, "//*[@role='option' or text()='Select all']")
            texts = [e.text.strip() for e in found]
        except StaleElementReferenceException:
            return None
        if not found:  # a click that only focused the box (its picks fill it and it scrolls):
            # the arrow key opens the list, as it does for someone at the keyboard
            try:
                browser.switch_to.active_element.send_keys(Keys.ARROW_DOWN)
            except (ElementNotInteractableException, StaleElementReferenceException):
                pass
            return None
        return texts

    if "Select all" not in _until("the picker's options", option_texts, poll=1.0):
        pytest.skip("this Streamlit's multiselect has no *Select all*")
    # found and clicked in one script, so no element reference can go stale between the two;
    # a click from script also reaches an option list that sits under the page's own elements
    click_select_all = """
        const hit = document.evaluate("//*[text()='Select all']", document, null,
            XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
        if (hit) { hit.click(); }
        return hit !== null;"""
    _until(
        "the picker's *Select all* to be clicked", lambda: browser.execute_script(click_select_all)
    )
    panel = _until(
        "every group to be shown",
        lambda: (p := _tab(browser, title)) and " groups shown." in p.text and p,
        timeout=240,
    )
    shown = [line for line in panel.text.splitlines() if line.endswith(" groups shown.")]
    n, _, total = shown[0].split()[:3]
    assert n == total and int(n) > 40, shown
    problems = layout_problems(browser.execute_script(LAYOUT_JS, panel), WINDOW[0])
    assert not problems, problems
    assert len(_charts(panel)) == 2
    browser.save_screenshot(str(tmp_path / "every-group.png"))
    assert not _console_errors(browser), _console_errors(browser)
