"""The dashboard in a real headless Chromium (Debian's, driven by Playwright): opened from disk, no console errors,
the matrix filter narrows rows, a click opens a cell page, a planted regression is listed on the overview and the
Changes page, a filtered and sorted matrix survives a reload from its address, headers sort from the keyboard, and
axe-core finds no serious or critical accessibility violation on any page. Screenshots of the overview and the
matrix, and the measured filter time on 2,000 cells, go to test-artifacts/."""

import json
import shutil
import statistics
from pathlib import Path

import pytest

from harness.store import CELL_LOG_MARKER
from reports import write_report

from .conftest import synthetic_record, synthetic_run

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PAGES = ["index.html", "changes.html", "matrix.html", "failures.html", "parity.html", "registry.html", "workarounds.html",
         "history.html"]
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--no-first-run", "--disable-sync", "--disable-quic"]  # fmt: skip


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: run .ci/setup (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    columns = [("onnx", "static"), ("onnx", "dynamic")]  # 2,000 classes: 2,000 matrix rows
    synthetic_run(root / "before", 4000, seed=1, failing=0.0, columns=columns)
    after = synthetic_run(root / "after", 4000, seed=1, failing=0.0, columns=columns)
    planted = synthetic_record("Model0007ForCausalLM", "onnx", "dynamic", "fail", "onnx-translation",
                               "planted regression", model_type="type7")  # fmt: skip
    after.write(planted)
    after.logs_dir.mkdir()  # what its worker wrote: long enough to scroll
    lines = "\n".join(f"[translation] step {n}: <node {n}>" for n in range(300))
    (after.logs_dir / "Model0007ForCausalLM.log").write_text(f"{CELL_LOG_MARKER}{planted.cell_id}\n{lines}\n")
    site = write_report(root / "after", baseline=root / "before")
    assert "step 299: &lt;node 299&gt;" in (site / "cells" / f"{planted.cell_id}.html").read_text()
    return site


def _page(browser, errors):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return page


def test_overview_lists_the_planted_regression(browser, site):
    errors = []
    page = _page(browser, errors)
    page.goto((site / "index.html").as_uri())
    regressions = page.locator("ul.regressions li")
    assert regressions.count() == 1
    assert "Model0007ForCausalLM-onnx-dynamic" in regressions.first.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "overview.png"), full_page=True)
    assert errors == []


def test_matrix_filters_and_opens_a_cell(browser, site):
    errors = []
    page = _page(browser, errors)
    page.goto((site / "matrix.html").as_uri())
    rows = page.locator("#matrix tbody tr")
    total = rows.count()
    assert total == 2000
    visible = lambda: page.locator("#matrix tbody tr:not([hidden])").count()  # noqa: E731
    assert visible() == total
    page.fill("#f-text", "Model000")
    page.wait_for_function("document.getElementById('f-count').textContent.startsWith('10 of')")
    assert visible() == 10  # Model0000 ... Model0009
    page.fill("#f-text", "")
    page.select_option("#f-status", "fail")
    page.wait_for_function("document.getElementById('f-count').textContent.startsWith('1 of')")
    assert visible() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "matrix.png"), full_page=False)

    # how long one filter pass over every row takes, median of several
    timings = page.evaluate("""() => {
        const box = document.getElementById('f-text'), times = [];
        document.getElementById('f-status').value = '';
        for (const text of ['Model01', 'type3', 'causal', 'Model0', 'zzz', '']) {
            box.value = text; const start = performance.now(); window.exportSweepMatrix.apply();
            void document.body.offsetHeight;  // include the re-layout the filter causes
            times.push(performance.now() - start);
        }
        return times;
    }""")
    median = statistics.median(timings)
    (ARTIFACTS / "matrix-filter.json").write_text(json.dumps({"rows": total, "filter_ms": timings, "median_ms": median}))
    print(f"matrix filter over {total} rows: median {median:.1f} ms")

    page.select_option("#f-status", "fail")
    page.wait_for_function("document.getElementById('f-count').textContent.startsWith('1 of')")
    page.locator("#matrix tbody tr:not([hidden]) a.badge.c-fail").first.click()
    page.wait_for_load_state()
    assert page.url.endswith("cells/Model0007ForCausalLM-onnx-dynamic.html")
    assert "planted regression" in page.inner_text("pre.message")
    assert errors == []


def test_the_changes_page_lists_the_regression_first(browser, site):
    errors = []
    page = _page(browser, errors)
    page.goto((site / "changes.html").as_uri())
    first = page.locator("section.change-kind").first
    assert first.get_attribute("id") == "regression"
    assert "Model0007ForCausalLM-onnx-dynamic" in first.inner_text()
    assert "pass → fail at onnx-translation" in first.inner_text()
    page.click("a[href='#regression']")
    assert page.url.endswith("changes.html#regression")
    assert errors == []


def test_a_filtered_sorted_matrix_is_a_link_that_opens_the_same_view(browser, site):
    errors = []
    page = _page(browser, errors)
    page.goto((site / "matrix.html").as_uri())
    page.select_option("#f-status", "fail")
    page.locator("th button", has_text="onnx").first.focus()
    page.keyboard.press("Enter")  # sorting from the keyboard: the header is a button
    header = page.locator("#matrix thead th").nth(3)
    assert header.get_attribute("aria-sort") == "ascending"
    shared = page.url
    assert "status=fail" in shared and "sort=3-asc" in shared
    again = _page(browser, errors)
    again.goto(shared)
    assert again.locator("#f-status").input_value() == "fail"
    assert again.locator("#matrix thead th").nth(3).get_attribute("aria-sort") == "ascending"
    assert again.locator("#matrix tbody tr:not([hidden])").count() == 1
    assert errors == []


def test_the_matrix_fits_a_1400_pixel_window(browser, site):
    page = _page(browser, [])
    page.goto((site / "matrix.html").as_uri())
    width = page.evaluate("document.getElementById('matrix').getBoundingClientRect().right")
    assert width <= 1400, f"the matrix is {width:.0f} px wide"


def test_no_serious_or_critical_accessibility_violation(browser, site):
    from axe_playwright_python.sync_playwright import Axe

    axe = Axe()
    page = _page(browser, [])
    problems = {}
    cells = [next((site / "cells").glob("*.html")), site / "cells" / "Model0007ForCausalLM-onnx-dynamic.html"]
    for target in [site / name for name in PAGES] + cells:
        page.goto(target.as_uri())
        results = axe.run(page)
        serious = [v for v in results.response["violations"] if v["impact"] in ("serious", "critical")]
        if serious:
            problems[target.name] = [(v["id"], v["help"], [n["target"] for n in v["nodes"][:3]]) for v in serious]
    assert problems == {}


def test_every_page_loads_without_console_errors(browser, site):
    errors = []
    page = _page(browser, errors)
    for name in ["changes.html", "failures.html", "parity.html", "registry.html", "workarounds.html", "history.html"]:
        page.goto((site / name).as_uri())
        assert page.locator("h1").count() == 1
    page.click("text=Matrix")
    assert page.url.endswith("matrix.html")
    assert errors == []
