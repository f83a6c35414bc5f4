"""Plotly figures as static PNG images, for the places that run no JavaScript: a notebook on GitHub, a notebook
exported to HTML after its plotly.js bundle was dropped (tools/slim_notebooks.py).

plotly's own static export needs kaleido, which this project does not depend on. What is here instead: the
plotly.js that ships inside the plotly package draws each figure in headless Chromium (driven by Playwright, the
same pair the dashboard's browser tests use) and `Plotly.toImage` returns the PNG: the very chart the notebook
shows, offline, no new dependency. Without Chromium or Playwright, `available()` says why and nothing is drawn.
"""
from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
WIDTH, HEIGHT = 960, 450  # a figure without its own size: about a notebook column

DRAW = """async f => {
  const d = document.createElement('div'); document.body.appendChild(d);
  const layout = Object.assign({}, f.layout || {});
  const w = layout.width || %d, h = layout.height || %d;
  await Plotly.newPlot(d, f.data || [], layout, {staticPlot: true});
  const url = await Plotly.toImage(d, {format: 'png', width: w, height: h});
  Plotly.purge(d); d.remove();
  return url;
}""" % (WIDTH, HEIGHT)


def chromium() -> str | None:
    return os.environ.get("QWEN3LAB_CHROMIUM") or next((p for p in CHROMIUM_PATHS if os.path.exists(p)), None)


def plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def available() -> str | None:
    """None when PNGs can be drawn here, else why not (what to install)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no Playwright (pip install playwright; no browser download needed)"
    if chromium() is None:
        return f"no Chromium at {', '.join(CHROMIUM_PATHS)} (apt-get install chromium, or set QWEN3LAB_CHROMIUM)"
    if not plotly_js().is_file():
        return f"no plotly.js at {plotly_js()}"
    return None


def pngs(figures: Iterable[dict]) -> list[bytes]:
    """Each figure (a plotly figure dict: data, layout) as PNG bytes, all in one Chromium page."""
    from playwright.sync_api import sync_playwright

    figures = list(figures)
    if not figures:
        return []
    why = available()
    if why:
        raise RuntimeError(f"cannot draw static charts: {why}")
    profile = tempfile.mkdtemp(prefix="qwen3lab-charts-")
    try:
        with sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(profile, executable_path=chromium(), args=FLAGS, headless=True)
            page = ctx.new_page()
            page.set_content("<html><body></body></html>")
            page.add_script_tag(path=str(plotly_js()))
            out = []
            for fig in figures:
                url = page.evaluate(DRAW, {"data": fig.get("data", []), "layout": fig.get("layout", {})})
                out.append(base64.b64decode(url.split(",", 1)[1]))
            ctx.close()
        return out
    finally:
        shutil.rmtree(profile, ignore_errors=True)
