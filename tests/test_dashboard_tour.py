"""A tour of the dashboard as a new user takes it, on the committed H200 files, in headless Chromium at 1440x1000:
every page, a screenshot each (tests/artifacts/dashboard-tour-*.png, git-ignored). It fails on a traceback, on an empty
opening state where comparable runs exist, and on a decisive column cut short (at 1440 px, and on the Runs and
Claims pages in a 1024 px window too). One Streamlit and one Chromium at a time: run it under the server lock.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.test_dashboard_browser import CHROMIUM, FLAGS, dashboard, sync_api
from tests.test_dashboard_browser import shot as browser_shot

from dashboard import ui
from qwen3lab.analysis import compare
from qwen3lab.store import Store

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
pytestmark = [pytest.mark.browser, pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no {CHROMIUM}")]

PAGES = {"runs": "Runs", "compare": "Compare runs", "winner": "Pick the winner under your SLOs",
         "export": "Export the launch command", "claims": "Claims: does each knob change help?",
         "capacity": "Capacity", "drift": "Drift"}
# The columns a reader decides by, per page: each must be on screen, whole (no cell of it cut short)
DECISIVE = {"runs": ["started", "trial", "status", "vLLM"], "winner": ["trial", "meets SLOs", "misses the SLOs by"],
            "claims": ["verdict", "trial"], "capacity": ["trial", "capacity (req/s)"]}

# Glide's grid draws its cells on a canvas; its accessibility table holds each visible cell's text and the grid's
# own column widths are in the header cells' boxes. A cell is cut when its text, in the grid's font, is wider
# than its column less the cell's padding.
CUT_CELLS = """(grid, names) => {
  const heads = [...grid.querySelectorAll('thead th, [role=columnheader]')];
  const canvas = document.createElement('canvas').getContext('2d');
  const font = getComputedStyle(grid).fontFamily || 'sans-serif';
  const out = {missing: [], cut: [], offscreen: []};
  const right = document.documentElement.clientWidth;
  for (const name of names) {
    const i = heads.findIndex(h => h.innerText.trim() === name);
    if (i < 0) { out.missing.push(name); continue; }
    const head = heads[i].getBoundingClientRect();
    if (head.left < 0 || head.left + 30 > right) out.offscreen.push(name);
    const col = heads[i].getAttribute('aria-colindex');
    const cells = [...grid.querySelectorAll(`[role=gridcell][aria-colindex="${col}"], td[aria-colindex="${col}"]`)];
    for (const c of cells) {
      const text = c.innerText.trim();
      canvas.font = `14px ${font}`;
      if (text && canvas.measureText(text).width > head.width - 16) out.cut.push(`${name}: ${text}`);
    }
  }
  return out;
}"""


def shot(page, name: str) -> Path:
    return browser_shot(page, f"tour-{name}", chart_wait_ms=3_000)  # tests/artifacts/dashboard-tour-*.png


def no_traceback(page, where: str) -> None:
    errors = page.locator("[data-testid='stException']")
    assert not errors.count(), f"{where}: {errors.first.inner_text()[:2000]}"


def whole_columns(page, where: str, names: list[str]) -> None:
    grid = page.locator("[data-testid='stDataFrame']").first
    grid.wait_for()
    page.wait_for_timeout(500)
    found = grid.evaluate(CUT_CELLS, names)
    assert not found["missing"], f"{where}: no column {found['missing']} in the first table"
    assert not found["offscreen"], f"{where}: decisive columns off screen: {found['offscreen']}"
    assert not found["cut"], f"{where}: cut short: {found['cut'][:5]}"


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(tempfile.mkdtemp(prefix="chromium-"), executable_path=CHROMIUM,
                                                   args=FLAGS, headless=True, viewport={"width": 1440, "height": 1000})
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        yield page
        ctx.close()


def copy(name: str) -> Path:
    db = Path(tempfile.mkdtemp(prefix="tour-")) / name
    shutil.copy(RESULTS / name, db)  # the committed file is never written
    return db


def open_page(page, base: str, path: str) -> None:
    page.goto(f"{base}/{path}")
    page.get_by_role("heading", name=PAGES[path], exact=True).wait_for()
    page.wait_for_timeout(1000)  # the page's own reruns (selection, cached queries)


def test_tour_of_the_h200_results(browser):
    db = copy("h200-qwen3-14b.duckdb")
    store = Store(db)
    group = ui.default_selection(store.runs())
    assert len(group) >= 2  # comparable runs exist: the opening page must show their comparison
    w = compare.pick_winner(compare.load_runs(store, group), compare.stored_slo(store, "h200-qwen3-14b"))
    page = browser
    page.set_viewport_size({"width": 1440, "height": 1000})
    with dashboard(db) as base:
        page.goto(base)
        page.get_by_role("heading", name="Compare runs").wait_for()
        # the opening state: a comparison and its answer, not "pick two or more runs"
        page.get_by_text(f"Winner: {w.winner.label}" if w.winner else "No winner under these SLOs").first.wait_for()
        assert page.locator(".js-plotly-plot").count() >= 1
        no_traceback(page, "compare")
        shot(page, "h200-compare")
        for path in ("runs", "winner", "export", "claims", "capacity", "drift"):
            open_page(page, base, path)
            no_traceback(page, path)
            if path in DECISIVE and path != "capacity":
                whole_columns(page, path, DECISIVE[path])
            shot(page, f"h200-{path}")
        page.set_viewport_size({"width": 1024, "height": 900})
        for path in ("runs", "claims"):
            open_page(page, base, path)
            whole_columns(page, f"{path} at 1024 px", DECISIVE[path][:2])
            shot(page, f"h200-{path}-1024")
        page.set_viewport_size({"width": 1440, "height": 1000})


def test_tour_of_the_h200_capacities(browser):
    db = copy("h200-qwen3-14b-capacity.duckdb")
    page = browser
    with dashboard(db) as base:
        page.goto(base)
        page.get_by_role("heading", name="Capacity", exact=True).wait_for()
        page.get_by_text("Winner by capacity:").wait_for()  # opens on the answer
        no_traceback(page, "capacity")
        whole_columns(page, "capacity", DECISIVE["capacity"])
        shot(page, "capacity-capacity")
        for path in ("runs", "compare", "winner", "export", "claims", "drift"):
            open_page(page, base, path)
            no_traceback(page, path)
            shot(page, f"capacity-{path}")
