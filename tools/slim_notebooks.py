"""Slim executed workbook notebooks for committing: drop the plotly.js bundle (4.9 MB, embedded once per
notebook by the "plotly_mimetype+notebook" renderer) and each figure's HTML twin that needs it, keeping the
figure itself (application/vnd.plotly.v1+json, which JupyterLab renders) and every other output; and give each
figure a static PNG twin (image/png, qwen3lab.analysis.static_charts: plotly.js in headless Chromium), which is
what GitHub and an HTML export (nbconvert) show, since neither runs the figure's JavaScript.

    python tools/slim_notebooks.py [--no-images] SRC.ipynb... DSTDIR

A slimmed notebook can be slimmed again (its figures are still there): that adds the PNGs to older ones.
"""
import base64
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen3lab.analysis import static_charts  # noqa: E402

PLOTLY = "application/vnd.plotly.v1+json"
args = sys.argv[1:]
images = "--no-images" not in args
*sources, dst = [a for a in args if a != "--no-images"]
if images and (why := static_charts.available()):
    sys.exit(f"cannot draw the static PNGs: {why}; or pass --no-images")
Path(dst).mkdir(parents=True, exist_ok=True)
for src in map(Path, sources):
    nb = json.loads(src.read_text())
    figures = []
    for cell in nb["cells"]:
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            html = "".join(data.get("text/html", ""))
            if set(data) == {"text/html"} and "PlotlyConfig" in html and len(html) > 1_000_000:
                continue  # the bundle itself
            if PLOTLY in data:
                data.pop("text/html", None)
                figures.append(data)
            outputs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outputs
    if images:
        for data, png in zip(figures, static_charts.pngs(d[PLOTLY] for d in figures)):
            data["image/png"] = base64.b64encode(png).decode()
    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    (Path(dst) / src.name).write_text(text)
    print(f"{src.name}: {src.stat().st_size / 1e6:.1f} MB -> {len(text.encode()) / 1e6:.2f} MB, "
          f"{len(figures)} figures{' with PNGs' if images else ''}")
