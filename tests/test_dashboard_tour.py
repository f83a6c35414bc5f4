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

# Glide's grid draws its cells and headers on a canvas. What the DOM has: an accessibility table with each visible
# header and cell's text (aria-colindex). The columns' drawn widths come from the canvas itself: in a screenshot
# of the header strip, the column separators are the pixel columns of one non-background colour from top to
# bottom (text and icons never are). A cell is cut when its text, in the page's font, is wider than its column
# less glide's 8 px padding a side.
TEXTS = """(grid) => {
  const heads = [...grid.querySelectorAll('th[role=columnheader]')].map(h => [Number(h.getAttribute('aria-colindex')), h.innerText.trim()]);
  const cells = {};
  for (const c of grid.querySelectorAll('td[role=gridcell]')) {
    const i = Number(c.getAttribute('aria-colindex'));
    (cells[i] = cells[i] || []).push(c.innerText.trim());
  }
  return {heads, cells};
}"""
MEASURE = """(texts) => {
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `14px ${getComputedStyle(document.body).fontFamily}`;
  return texts.map(t => ctx.measureText(t).width);
}"""


def column_edges(grid) -> tuple[list[float], float]:
    """x of each column separator in the grid's header strip (CSS px from the grid's left), and the grid's left."""
    import io

    from PIL import Image

    box = grid.bounding_box()
    img = Image.open(io.BytesIO(grid.screenshot())).convert("RGB")
    scale = img.width / box["width"]
    rows = range(int(6 * scale), int(28 * scale))
    mid = [img.getpixel((x, int(17 * scale))) for x in range(img.width)]
    background = max(set(mid), key=mid.count)
    xs = [x for x in range(img.width)
          if mid[x] != background and len({img.getpixel((x, y)) for y in rows}) == 1]
    edges = [x / scale for i, x in enumerate(xs) if i == 0 or x - xs[i - 1] > 2]
    if not edges or edges[0] > 3:  # no outer border drawn on the left: the first column starts at the grid's edge
        edges.insert(0, 0.0)
    return edges, box["x"]


def shot(page, name: str) -> Path:
    return browser_shot(page, f"tour-{name}", chart_wait_ms=3_000)  # tests/artifacts/dashboard-tour-*.png


def no_traceback(page, where: str) -> None:
    errors = page.locator("[data-testid='stException']")
    assert not errors.count(), f"{where}: {errors.first.inner_text()[:2000]}"


def whole_columns(page, where: str, names: list[str]) -> None:
    """Each named column of the page's first table on screen, no cell of it wider than the column."""
    grid = page.locator("[data-testid='stDataFrame']").first
    grid.wait_for()
    page.wait_for_timeout(500)
    found = grid.evaluate(TEXTS)
    heads = sorted(found["heads"])
    edges, left = column_edges(grid)
    first = heads[0][0] if heads else 1
    # a selectable table draws a row-marker column first, which has no header of its own
    spans = list(zip(edges, edges[1:]))[1 if first > 1 else 0:]
    window = page.viewport_size["width"]
    debug = f"{where}: headers {heads}, separators {[round(e) for e in edges]}"
    for name in names:
        at = [i for i, (_, text) in enumerate(heads) if text == name]
        assert at, f"no column {name!r}; {debug}"
        assert at[0] < len(spans), f"column {name!r} is not drawn on screen; {debug}"
        x0, x1 = spans[at[0]]
        assert left + x1 <= window + 1, f"column {name!r} runs off the window ({left + x1:.0f} > {window}); {debug}"
        texts = [t for t in found["cells"].get(str(heads[at[0]][0]), found["cells"].get(heads[at[0]][0], [])) if t]
        widths = grid.evaluate(MEASURE, texts)
        cut = [t for t, w in zip(texts, widths) if w > (x1 - x0) - 16 + 2]
        assert not cut, f"{where}: column {name!r} ({x1 - x0:.0f} px) cuts {cut[:4]}"


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
