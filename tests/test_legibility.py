"""What the charts and tables show a reader, on the committed H200 files: one colour per run in every panel,
each capacity star in its configuration's colour and labelled, Pareto labels apart, blanks for missing values."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from dashboard import ui
from qwen3lab.analysis import compare, plots
from qwen3lab.store import Store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    out = {}
    for name in ("h200-qwen3-14b.duckdb", "h200-qwen3-14b-capacity.duckdb"):
        path = tmp_path_factory.mktemp("h200") / name
        shutil.copy(ROOT / "experiments" / "results" / name, path)  # the committed file is never written
        out[name.split(".")[0]] = Store(path)
    return out


def test_a_run_has_one_colour_in_every_panel_and_chart(h200):
    store = h200["h200-qwen3-14b"]
    ids = ui.default_selection(store.runs())
    fig = plots.timeseries_figure(store.samples(ids), {}, plots.SERVER_SERIES)
    by_run: dict[str, set] = {}
    for trace in fig.data:
        by_run.setdefault(trace.legendgroup, set()).add(trace.line.color)
    assert len(by_run) == len(ids) and all(len(c) == 1 for c in by_run.values())
    assert len({next(iter(c)) for c in by_run.values()}) == len(ids)  # and runs apart from each other
    cdf = plots.cdf_figure(store.requests(ids, with_chunks=False), "ttft", {r: r for r in ids})
    assert {t.name: t.line.color for t in cdf.data} == {r: next(iter(c)) for r, c in by_run.items()}


def test_capacity_stars_carry_their_configurations_colour_and_load(h200):
    store = h200["h200-qwen3-14b-capacity"]
    searches = store.capacities()
    fig = plots.load_curve_figure(store.capacity_points(list(searches.search_id)), searches, "p95_ttft_ms")
    lines = {t.legendgroup: t.line.color for t in fig.data if t.mode == "lines+markers"}
    stars = [t for t in fig.data if t.mode == "markers+text"]
    assert len(stars) >= 2 and len({s.marker.color for s in stars}) == len(stars)
    capacity = dict(zip(searches.search_id, searches.capacity))
    for s in stars:
        assert s.marker.color == lines[s.legendgroup] and s.text == (f"{capacity[s.legendgroup]:g}",)


def test_pareto_labels_do_not_overlap(h200):
    store = h200["h200-qwen3-14b"]
    ids = ui.default_selection(store.runs())
    w = compare.pick_winner(compare.load_runs(store, ids), compare.stored_slo(store, "h200-qwen3-14b"))
    fig = plots.pareto_figure(w.ranking, label="label", slo_ttft_ms=500)
    xr, yr = fig.layout.xaxis.range, fig.layout.yaxis.range
    labels = [a for a in fig.layout.annotations if a.name == "label"]
    assert sorted(a.text for a in labels) == sorted(w.ranking.label)  # every run labelled, by its full name
    boxes = [plots.label_box((a.x - xr[0]) / (xr[1] - xr[0]) * 640, (a.y - yr[0]) / (yr[1] - yr[0]) * 380, a.ax, a.ay,
                             a.text) for a in labels]
    overlaps = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                if min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])]
    assert len(labels) >= 5 and not overlaps, overlaps


def test_missing_values_are_blank_not_none():
    df = pd.DataFrame({"reason": [None, "oom"], "validity": [float("nan"), "ok"], "n": [1.0, float("nan")]})
    shown = ui.blanks(df)
    assert list(shown.reason) == ["", "oom"] and list(shown.validity) == ["", "ok"]
    assert shown.n.isna().tolist() == [False, True]  # numbers stay numbers
