"""Slim executed workbook notebooks for committing: drop the plotly.js bundle (4.9 MB, embedded once per
notebook by the "plotly_mimetype+notebook" renderer) and each figure's HTML twin that needs it, keeping the
figure itself (application/vnd.plotly.v1+json, which JupyterLab renders) and every other output.

    python tools/slim_notebooks.py SRC.ipynb... DSTDIR
"""
import json
import sys
from pathlib import Path

PLOTLY = "application/vnd.plotly.v1+json"
*sources, dst = sys.argv[1:]
Path(dst).mkdir(parents=True, exist_ok=True)
for src in map(Path, sources):
    nb = json.loads(src.read_text())
    for cell in nb["cells"]:
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            html = "".join(data.get("text/html", ""))
            if set(data) == {"text/html"} and "PlotlyConfig" in html and len(html) > 1_000_000:
                continue  # the bundle itself
            if PLOTLY in data:
                data.pop("text/html", None)
            outputs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outputs
    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    (Path(dst) / src.name).write_text(text)
    print(f"{src.name}: {src.stat().st_size / 1e6:.1f} MB -> {len(text.encode()) / 1e6:.2f} MB")
