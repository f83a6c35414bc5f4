"""Static PNG twins of the notebooks' plotly figures (tools/slim_notebooks.py, qwen3lab.analysis.static_charts):
a committed executed notebook slimmed again keeps every figure and gains a PNG of it, which nbconvert's HTML
export then shows (no JavaScript needed). Drives headless Chromium: run it under the server lock."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3lab.analysis import static_charts

ROOT = Path(__file__).resolve().parents[1]
PLOTLY = "application/vnd.plotly.v1+json"
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(static_charts.available() is not None, reason=str(static_charts.available()))]


def test_slimmed_notebook_figures_get_png_twins_that_html_export_shows(tmp_path):
    src = ROOT / "experiments" / "results" / "h200-notebooks" / "30_block_size.ipynb"
    before = [o["data"][PLOTLY] for c in json.loads(src.read_text())["cells"] for o in c.get("outputs", [])
              if PLOTLY in o.get("data", {})]
    assert before
    got = subprocess.run([sys.executable, "tools/slim_notebooks.py", str(src), str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    nb = json.loads((tmp_path / src.name).read_text())
    figures = [o["data"] for c in nb["cells"] for o in c.get("outputs", []) if PLOTLY in o.get("data", {})]
    assert [f[PLOTLY] for f in figures] == before  # the interactive figure is kept as it was
    for f in figures:
        png = base64.b64decode(f["image/png"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width = int.from_bytes(png[16:20], "big")
        assert width == (f[PLOTLY].get("layout", {}).get("width") or static_charts.WIDTH)
        assert len(png) > 10_000  # a drawn chart, not a blank image
    import nbformat
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(nbformat.reads(json.dumps(nb), as_version=4))
    assert html.count("data:image/png;base64,") >= len(figures)  # what an HTML export (and GitHub) shows
