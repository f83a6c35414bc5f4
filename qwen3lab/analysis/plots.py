"""Plotly figures shared by the notebooks and the dashboard; each takes what a `store` query returns."""
from __future__ import annotations

import numpy as np
import pandas as pd

from qwen3lab.analysis import metrics

LATENCY_LABELS = {"ttft": "TTFT (ms)", "tpot": "TPOT (ms)", "e2el": "E2EL (ms)", "itl": "ITL (ms)"}
SERVER_SERIES = {
    "vllm:num_requests_running": "running requests", "vllm:num_requests_waiting": "waiting requests",
    "vllm:kv_cache_usage_perc": "KV cache usage (0-1)", "vllm:num_preemptions_total": "preemptions (total)",
}
GPU_SERIES = {"memory_used_mib": "GPU memory used (MiB)", "utilization_pct": "GPU utilization (%)",
              "power_w": "GPU power (W)"}


def _go():
    import plotly.graph_objects as go

    return go


# One colour per run (or capacity search), the same in every panel and every chart drawn from the same rows:
# assigned in sorted id order (the store returns rows by run_id), never by trace order, which shifts between panels.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
           "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94")


def colours(ids) -> dict[str, str]:
    return {i: PALETTE[n % len(PALETTE)] for n, i in enumerate(sorted(set(map(str, ids))))}


def pareto_front(points: pd.DataFrame, x: str = "p95_ttft_ms", y: str = "output_throughput") -> pd.Series:
    """True where no other point has both lower (or equal) x and higher (or equal) y, one of them strictly."""
    xs, ys = points[x].to_numpy(float), points[y].to_numpy(float)
    front = []
    for i in range(len(points)):
        dominated = np.any((xs <= xs[i]) & (ys >= ys[i]) & ((xs < xs[i]) | (ys > ys[i])))
        front.append(not dominated and not np.isnan(xs[i]) and not np.isnan(ys[i]))
    return pd.Series(front, index=points.index)


def pareto_figure(runs: pd.DataFrame, label: str = "trial", slo_ttft_ms: float | None = None):
    """Output throughput against P95 TTFT, one marker a run, the Pareto front joined by a line.

    slo_ttft_ms draws the TTFT limit: runs right of it miss the SLO whatever their throughput.
    """
    go = _go()
    fig = go.Figure()
    if runs.empty:  # an experiment with no runs yet has no columns either
        return _empty(fig, "No finished runs to compare yet")
    df = runs.dropna(subset=["p95_ttft_ms", "output_throughput"]).copy()
    if df.empty:
        return _empty(fig, "No finished runs to compare yet")
    df["front"] = pareto_front(df)
    names = df[label].astype(str) if label in df else df.run_id
    xs, ys = df.p95_ttft_ms.to_numpy(float), df.output_throughput.to_numpy(float)
    lo, hi = float(np.nanmin(xs)), float(np.nanmax(xs))
    if slo_ttft_ms:
        lo, hi = min(lo, slo_ttft_ms), max(hi, slo_ttft_ms)
    pad = max(hi - lo, hi * 0.1, 1.0) * 0.12  # room for the labels at both ends
    ypad = max(np.nanmax(ys) - np.nanmin(ys), np.nanmax(ys) * 0.05, 1.0) * 0.15
    xr, yr = (max(lo - pad, 0), hi + pad), (np.nanmin(ys) - ypad, np.nanmax(ys) + 1.5 * ypad)
    fig.add_trace(go.Scatter(x=df.p95_ttft_ms, y=df.output_throughput, mode="markers", text=names, name="runs",
                             marker=dict(size=11, color=np.where(df.front, "#d62728", "#1f77b4")),
                             customdata=df.run_id,
                             hovertemplate="%{text}<br>P95 TTFT %{x:.1f} ms<br>%{y:.1f} tok/s<br>%{customdata}"))
    # each label an annotation with a leader line, placed apart from the other labels and the markers
    fig.update_layout(annotations=[  # one update, not one add_annotation a run (each validates the whole layout)
        dict(x=x, y=y, text=str(name), ax=ax, ay=ay, showarrow=True, arrowhead=0, arrowwidth=1, arrowcolor="#aaaaaa",
             font=dict(size=LABEL_FONT_PX), name="label")
        for x, y, name, (ax, ay) in zip(xs, ys, names, label_offsets(xs, ys, list(names), xr, yr))])
    front = df[df.front].sort_values("p95_ttft_ms")
    fig.add_trace(go.Scatter(x=front.p95_ttft_ms, y=front.output_throughput, mode="lines", name="Pareto front",
                             line=dict(color="#d62728", dash="dash")))
    if slo_ttft_ms:
        fig.add_vline(x=slo_ttft_ms, line_dash="dot", line_color="#7f7f7f",
                      annotation_text=f"P95 TTFT SLO {slo_ttft_ms:g} ms", annotation_position="bottom right")
    fig.update_xaxes(range=list(xr))
    fig.update_yaxes(range=list(yr))
    fig.update_layout(title="Throughput vs P95 TTFT (up and left is better; red: the Pareto front)",
                      xaxis_title="P95 TTFT (ms)", yaxis_title="output tokens/s", height=460,
                      legend=dict(orientation="h", y=-0.18))
    return fig


LABEL_FONT_PX = 12


def label_box(px: float, py: float, ax: float, ay: float, text: str) -> tuple[float, float, float, float]:
    """The box (x0, y0, x1, y1; y up, px) of a label centred `ax` right and `ay` down (plotly's sense) of a point."""
    w, h = 0.6 * LABEL_FONT_PX * len(str(text)) + 6, LABEL_FONT_PX + 6.0
    cx, cy = px + ax, py - ay
    return cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2


def label_offsets(xs, ys, names: list[str], xr, yr, width_px: float = 640, height_px: float = 380) -> list[tuple]:
    """An (ax, ay) pixel offset per point for its label (an annotation with a leader line), chosen greedily, the
    highest point first, so that no label covers another label or a marker: crowded points get labels further out."""
    sx, sy = (xr[1] - xr[0]) or 1.0, (yr[1] - yr[0]) or 1.0
    pts = [((x - xr[0]) / sx * width_px, (y - yr[0]) / sy * height_px) for x, y in zip(xs, ys)]
    taken = [(px - 7, py - 7, px + 7, py + 7) for px, py in pts]  # the markers, then each label placed
    out = [(0.0, -20.0)] * len(names)
    tries = [(ax, ay) for ay in (-20, 20, -38, 38, -56, 56, -74, 74, -92, 92) for ax in (0, 60, -60, 120, -120)]
    for i in sorted(range(len(names)), key=lambda k: -(ys[k] if ys[k] == ys[k] else -np.inf)):
        cand = np.array([label_box(*pts[i], ax, ay, names[i]) for ax, ay in tries])  # (tries, 4)
        have = np.array(taken)  # (taken, 4)
        w = np.clip(np.minimum(cand[:, None, 2], have[None, :, 2]) - np.maximum(cand[:, None, 0], have[None, :, 0]), 0, None)
        h = np.clip(np.minimum(cand[:, None, 3], have[None, :, 3]) - np.maximum(cand[:, None, 1], have[None, :, 1]), 0, None)
        outside = ~((cand[:, 0] >= 0) & (cand[:, 2] <= width_px) & (cand[:, 1] >= 0) & (cand[:, 3] <= height_px))
        best = int(np.argmin((w * h).sum(axis=1) + 1e4 * outside))  # the first of the least covered
        taken.append(tuple(cand[best]))
        out[i] = tries[best]
    return out


def per_request_latency(requests: pd.DataFrame, metric: str) -> pd.Series:
    """Per-request latency in ms of the successful requests, as metrics defines them: ttft, e2el, tpot (requests
    of more than one token) or itl (pooled gaps)."""
    ok = requests[metrics.succeeded(requests.error, requests.ttft)]
    if metric in ("ttft", "e2el"):
        return ok[metric] * 1000
    if metric == "tpot":
        out = metrics.output_tokens(ok)
        values = pd.Series(metrics.tpot(out, ok.ttft, ok.e2el) * 1000, index=ok.index)
        return values[out > 1]
    if metric == "itl":
        return pd.Series(metrics.itl(ok.chunk_times) * 1000, dtype=float)
    raise ValueError(f"metric {metric!r}: use ttft, tpot, e2el or itl")


CDF_POINTS = 400


def _per_run_latency(requests: pd.DataFrame, metric: str):
    """(run_id, latencies in ms) per run, computed over all rows at once (ITL, pooled gaps, per run)."""
    if metric == "itl" or requests.empty:
        return [(r, per_request_latency(g, metric).to_numpy(float)) for r, g in requests.groupby("run_id", sort=False)]
    lat = per_request_latency(requests, metric)
    return [(r, v.to_numpy(float)) for r, v in lat.groupby(requests.run_id.loc[lat.index], sort=False)]


def cdf_figure(requests: pd.DataFrame, metric: str, labels: dict[str, str]):
    """Empirical CDF of a latency, one line per run (labels: run_id -> name)."""
    go = _go()
    fig = go.Figure()
    colour = colours(requests.run_id.unique()) if not requests.empty else {}
    for run_id, values in _per_run_latency(requests, metric):
        values = np.sort(values)
        if len(values) == 0:
            continue
        # at most CDF_POINTS steps a line: the same curve to the eye, a fraction of the page for 10,000 requests
        at = np.unique(np.linspace(0, len(values) - 1, min(len(values), CDF_POINTS)).round().astype(int))
        fig.add_trace(go.Scatter(x=values[at], y=(at + 1) / len(values), mode="lines",
                                 name=labels.get(run_id, run_id), line=dict(color=colour[str(run_id)])))
    fig.update_layout(title=f"CDF of {LATENCY_LABELS[metric]}", xaxis_title=LATENCY_LABELS[metric],
                      yaxis_title="fraction of requests", yaxis_range=[0, 1.01], height=380)
    return fig


def class_figure(requests: pd.DataFrame, labels: dict[str, str], metric: str = "ttft"):
    """A latency per request class of a mix (chat / summary / long document), one box per run and class."""
    go = _go()
    fig = go.Figure()
    colour = colours(requests.run_id.unique()) if not requests.empty else {}
    for run_id, group in requests.groupby("run_id", sort=False):
        values = per_request_latency(group, metric)
        classes = group.loc[values.index, "request_class"] if metric != "itl" else None
        fig.add_trace(go.Box(x=classes, y=values, name=labels.get(run_id, run_id), boxmean=True,
                             marker_color=colour[str(run_id)]))
    fig.update_layout(boxmode="group", title=f"{LATENCY_LABELS[metric]} by request class",
                      yaxis_title=LATENCY_LABELS[metric], height=380)
    return fig


def timeseries_figure(samples: pd.DataFrame, labels: dict[str, str], series: dict[str, str]):
    """One panel per series (server metrics or GPU samples) over seconds since the load started."""
    from plotly.subplots import make_subplots

    go = _go()
    present = [name for name in series if name in set(samples.name)] if not samples.empty else []
    if not present:
        return _empty(go.Figure(), "No samples recorded for these series (e.g. no GPU on this machine)")
    fig = make_subplots(rows=len(present), cols=1, shared_xaxes=True, subplot_titles=[series[n] for n in present],
                        vertical_spacing=0.08)
    colour = colours(samples.run_id.unique())
    for row, name in enumerate(present, start=1):
        for run_id, group in samples[samples.name == name].groupby("run_id", sort=False):
            # One GPU line per device; server metrics have one source.
            for source, g in group.groupby("source"):
                suffix = f" {source}" if source.startswith("gpu") and group.source.nunique() > 1 else ""
                fig.add_trace(go.Scatter(x=g.t, y=g.value, mode="lines", name=labels.get(run_id, run_id) + suffix,
                                         line=dict(color=colour[str(run_id)], dash="solid" if not suffix or
                                                   suffix.endswith("0") else "dash"),
                                         legendgroup=run_id, showlegend=row == 1), row=row, col=1)
    fig.update_xaxes(title_text="seconds since the load started", row=len(present), col=1)
    fig.update_layout(height=220 * len(present) + 80)
    return fig


def effects_figure(claims: pd.DataFrame, metric: str = "goodput"):
    """Each knob's change against its baseline, in percent, with its 95% interval (a forest plot)."""
    go = _go()
    df = claims[(claims.metric == metric) & claims.change_pct.notna()] if not claims.empty else claims
    fig = go.Figure()
    if df.empty:
        return _empty(fig, "No trial has a comparable finished baseline to compare against")
    names = df.chapter + "/" + df.trial + " vs " + df.baseline
    word = df.verdict.str.split(" ").str[0]  # "better (one launch: …)" is still better
    colours = word.map({"better": "#2ca02c", "worse": "#d62728"}).fillna("#7f7f7f")
    fig.add_trace(go.Scatter(x=df.change_pct, y=names, mode="markers", marker=dict(size=10, color=colours),
                             error_x=dict(type="data", symmetric=False, array=df.high_pct - df.change_pct,
                                          arrayminus=df.change_pct - df.low_pct),
                             text=df.verdict, hovertemplate="%{y}: %{x:+.1f}% (%{text})"))
    fig.add_vline(x=0, line_dash="dot")
    fig.update_layout(title=f"Change in {metric} against the baseline (95% interval)", xaxis_title="change (%)",
                      height=180 + 60 * len(df), yaxis=dict(type="category", automargin=True), showlegend=False)
    return fig


def ceiling_figure(ceilings: pd.DataFrame, labels: dict[str, str]):
    """Measured output throughput beside its roofline ceiling, one pair of bars a run, efficiency on top.

    ceilings: rows of `efficiency.run_ceiling` with a run_id column (only those with a ceiling are drawn)."""
    go = _go()
    df = ceilings[ceilings.available.astype(bool)] if not ceilings.empty else ceilings
    fig = go.Figure()
    if df.empty:
        return _empty(fig, "No ceiling for these runs (CPU engine, or a GPU not in the catalogue)")
    names = [labels.get(r, r) for r in df.run_id]
    fig.add_trace(go.Bar(x=names, y=df.output_tok_s_ceiling, name="ceiling (roofline)", marker_color="#c7c7c7"))
    fig.add_trace(go.Bar(x=names, y=df.output_tok_s, name="measured", marker_color="#1f77b4",
                         text=[f"{e:.0%}" if e == e else "" for e in df.output_efficiency.astype(float)],
                         textposition="outside"))
    fig.update_layout(barmode="group", title="Output throughput against its ceiling (efficiency on the bars)",
                      yaxis_title="output tokens/s", height=400)
    return fig


def prompt_length_figure(requests: pd.DataFrame, labels: dict[str, str], metric: str = "ttft"):
    """A latency against each request's prompt length, one marker per request, one colour per run."""
    go = _go()
    fig = go.Figure()
    colour = colours(requests.run_id.unique()) if not requests.empty else {}
    for run_id, group in requests.groupby("run_id", sort=False):
        values = per_request_latency(group, metric)
        if values.empty:
            continue
        lengths = group.loc[values.index, "prompt_tokens"].fillna(group.loc[values.index, "prompt_tokens_target"])
        fig.add_trace(go.Scatter(x=lengths, y=values, mode="markers", name=labels.get(run_id, run_id),
                                 marker_color=colour[str(run_id)], text=group.loc[values.index, "request_class"],
                                 hovertemplate="%{text}: %{x} tokens, %{y:.1f} ms"))
    if not fig.data:
        return _empty(fig, "No finished requests to plot")
    fig.update_layout(title=f"{LATENCY_LABELS[metric]} against prompt length", xaxis_title="prompt tokens",
                      yaxis_title=LATENCY_LABELS[metric], height=420)
    return fig


def request_box_figure(requests: pd.DataFrame, labels: dict[str, str], column: str, title: str, axis: str):
    """One box per run of a per-request column (e.g. output_tokens) or latency (ttft, e2el, tpot)."""
    go = _go()
    fig = go.Figure()
    colour = colours(requests.run_id.unique()) if not requests.empty else {}
    for run_id, group in requests.groupby("run_id", sort=False):
        ok = group[metrics.succeeded(group.error, group.ttft)]
        values = per_request_latency(ok, column) if column in LATENCY_LABELS else ok[column]
        fig.add_trace(go.Box(y=values, name=labels.get(run_id, run_id), boxmean=True, marker_color=colour[str(run_id)]))
    if not fig.data:
        return _empty(fig, "No finished requests to plot")
    fig.update_layout(title=title, yaxis_title=axis, height=380, showlegend=False)
    return fig


def bar_figure(df: pd.DataFrame, x: str, y: str, title: str, axis: str):
    """A bar per row (e.g. prefix-cache hit rate per trial); NaN bars are left out with a note."""
    go = _go()
    d = df.dropna(subset=[y])
    fig = go.Figure()
    if d.empty:
        return _empty(fig, f"No values of {y} recorded")
    fig.add_trace(go.Bar(x=d[x].astype(str), y=d[y]))
    fig.update_layout(title=title, yaxis_title=axis, height=360)
    return fig


def window_figure(windows: pd.DataFrame, labels: dict[str, str],
                  columns: tuple[str, ...] = ("p50_ttft_ms", "p95_ttft_ms", "p50_e2el_ms", "p95_e2el_ms")):
    """Windowed latency percentiles over a (soak) run: drift shows as a slope."""
    go = _go()
    fig = go.Figure()
    if windows.empty:
        return _empty(fig, "No windows: the run has no finished requests")
    colour = colours(windows.run_id.unique())
    dashes = ("solid", "dash", "dot", "dashdot")
    for run_id, g in windows.groupby("run_id", sort=False):
        for i, col in enumerate(columns):
            fig.add_trace(go.Scatter(x=g.window_start_s, y=g[col], mode="lines+markers",
                                     line=dict(color=colour[str(run_id)], dash=dashes[i % len(dashes)]),
                                     name=f"{labels.get(run_id, run_id)} {col.replace('_ms', '')}"))
    fig.update_layout(title="Latency per time window", xaxis_title="seconds since the load started",
                      yaxis_title="ms", height=420)
    return fig


SOAK_PANELS = {"latency (ms)": {"median_ttft_ms": "median TTFT", "p95_ttft_ms": "P95 TTFT", "p99_ttft_ms": "P99 TTFT",
                                "p99_tpot_ms": "P99 TPOT"},
               "output throughput (tok/s)": {"output_throughput": "output tok/s"},
               "memory (MiB)": {"server_rss_mib": "server RSS", "peak_gpu_memory_mib": "GPU memory (peak)"},
               "KV cache and preemptions": {"kv_cache_usage": "KV cache usage (0-1, mean)",
                                            "preemptions": "preemptions in the window"}}


def soak_figure(windows: pd.DataFrame):
    """A soak's windows over time, one panel per concern; a window that did not end ok is marked red."""
    from plotly.subplots import make_subplots

    go = _go()
    if windows.empty:
        return _empty(go.Figure(), "No windows stored for this soak yet")
    fig = make_subplots(rows=len(SOAK_PANELS), cols=1, shared_xaxes=True, subplot_titles=list(SOAK_PANELS),
                        vertical_spacing=0.07)
    x = windows.start_s / 3600 if windows.start_s.max() >= 7200 else windows.start_s
    for row, columns in enumerate(SOAK_PANELS.values(), start=1):
        for col, label in columns.items():
            if windows[col].notna().any():
                fig.add_trace(go.Scatter(x=x, y=windows[col], mode="lines+markers", name=label), row=row, col=1)
    for at, status in zip(x, windows.status):
        if status != "ok":  # a crash, an OOM, an interrupted window: the server was started again after it
            fig.add_vline(x=at, line_color="red", line_dash="dot", annotation_text=status)
    unit = "hours" if windows.start_s.max() >= 7200 else "seconds"
    fig.update_xaxes(title_text=f"{unit} since the first window", row=len(SOAK_PANELS), col=1)
    fig.update_layout(title="Soak windows over time: drift shows as a slope", height=220 * len(SOAK_PANELS))
    return fig


def _empty(fig, message: str):
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(xaxis_visible=False, yaxis_visible=False, height=200)
    return fig


# --- capacity and search ------------------------------------------------------------------------------------
CURVE_METRICS = {"p95_ttft_ms": "P95 TTFT (ms)", "p95_tpot_ms": "P95 TPOT (ms)", "p99_e2el_ms": "P99 E2EL (ms)",
                 "request_goodput": "goodput (req/s)", "attainment": "SLO attainment (share of requests)"}
AXIS_LABELS = {"request_rate": "offered load (requests/s)", "concurrency": "offered load (requests in flight)"}


def load_curve_figure(points: pd.DataFrame, searches: pd.DataFrame, metric: str = "p95_ttft_ms",
                      limit: float | None = None):
    """A metric against offered load, one line per configuration (capacity search); passing points filled,
    failing ones hollow, the capacity starred; `limit` draws the SLO (or the attainment floor)."""
    go = _go()
    fig = go.Figure()
    if points.empty or searches.empty:
        return _empty(fig, "No capacity measured yet: run qwen3lab capacity EXPERIMENT.yaml")
    names = dict(zip(searches.search_id, searches.chapter.astype(str) + "/" + searches.trial.astype(str)))
    capacity = dict(zip(searches.search_id, searches.capacity))
    colour = colours(points.search_id.dropna().unique())
    for search_id, g in points.dropna(subset=["offered_load"]).groupby("search_id", sort=False):
        g = g.sort_values("offered_load")
        passed = (g.point_verdict == "pass").to_numpy()
        c = colour[str(search_id)]
        trace = go.Scatter(x=g.offered_load, y=g[metric], mode="lines+markers", name=names.get(search_id, search_id),
                           marker=dict(size=9, symbol=np.where(passed, "circle", "circle-open"), color=c),
                           line=dict(color=c), legendgroup=search_id,
                           customdata=g.run_id, hovertemplate="load %{x:g}<br>%{y:.3g}<br>%{customdata}")
        fig.add_trace(trace)
        at = g[g.offered_load == capacity.get(search_id)]
        if not at.empty:  # the capacity: a star in its configuration's colour, labelled with the load
            fig.add_trace(go.Scatter(x=at.offered_load, y=at[metric], mode="markers+text", showlegend=False,
                                     legendgroup=search_id, text=[f"{v:g}" for v in at.offered_load],
                                     textposition="top center", textfont=dict(color=c),
                                     marker=dict(size=17, symbol="star", color=c, line=dict(width=1, color="#333")),
                                     hovertemplate=f"capacity of {names.get(search_id, search_id)}: %{{x:g}}"))
    if limit:
        fig.add_hline(y=limit, line_dash="dot", line_color="#7f7f7f",
                      annotation_text="SLO" if metric != "attainment" else "min attainment")
    axis = searches.axis.dropna().iloc[0] if "axis" in searches and searches.axis.notna().any() else None
    fig.update_layout(title=f"{CURVE_METRICS.get(metric, metric)} against offered load (star: each configuration's capacity)",
                      xaxis_title=AXIS_LABELS.get(axis, "offered load"), yaxis_title=CURVE_METRICS.get(metric, metric),
                      height=440)
    return fig


def search_history_figure(trials: pd.DataFrame, maximize: bool = True, objective: str = "objective"):
    """Each measured suggestion's objective in the order it was made, the best so far as a step line;
    pruned suggestions as grey crosses at the bottom (never launched), failures as red crosses."""
    go = _go()
    fig = go.Figure()
    if trials.empty:
        return _empty(fig, "No search stored yet: run qwen3lab search EXPERIMENT.yaml")
    done = trials[trials.state == "complete"].sort_values("number")
    floor = float(done.value.min()) if not done.empty else 0.0
    fig.add_trace(go.Scatter(x=done.number, y=done.value, mode="markers", name="measured", marker=dict(size=10),
                             text=done.trial, hovertemplate="#%{x} %{text}<br>%{y:g}"))
    if not done.empty:
        best = done.value.cummax() if maximize else done.value.cummin()
        fig.add_trace(go.Scatter(x=done.number, y=best, mode="lines", line_shape="hv", name="best so far",
                                 line=dict(color="#d62728")))
    for state, colour in (("pruned", "#7f7f7f"), ("failed", "#d62728")):
        other = trials[trials.state == state]
        if not other.empty:
            fig.add_trace(go.Scatter(x=other.number, y=[floor] * len(other), mode="markers", name=state,
                                     marker=dict(symbol="x", size=9, color=colour), text=other.reason,
                                     hovertemplate="#%{x} " + state + "<br>%{text}"))
    fig.update_layout(title="Search history", xaxis_title="suggestion", yaxis_title=objective, height=400)
    return fig


def search_front_figure(trials: pd.DataFrame, front: list[int], objectives: list[str]):
    """A two-objective search: each measured configuration's two values, the Pareto front (`front`: the
    suggestion numbers on it, as the search computed them) in red and joined, in the order of the second."""
    go = _go()
    fig = go.Figure()
    done = trials[trials.state == "complete"].dropna(subset=["value", "value2"])
    if done.empty or len(objectives) != 2:
        return _empty(fig, "No configuration measured with both objectives yet")
    on = done.number.isin(front)
    fig.add_trace(go.Scatter(x=done.value2, y=done.value, mode="markers", name="measured", text=done.trial,
                             customdata=done.number, marker=dict(size=10, color=np.where(on, "#d62728", "#1f77b4")),
                             hovertemplate="#%{customdata} %{text}<br>%{x:g}, %{y:g}"))
    edge = done[on].sort_values("value2")
    fig.add_trace(go.Scatter(x=edge.value2, y=edge.value, mode="lines", name="Pareto front",
                             line=dict(color="#d62728", dash="dash")))
    fig.update_layout(title=f"{objectives[0]} against {objectives[1]} (red: the Pareto front)",
                      xaxis_title=objectives[1], yaxis_title=objectives[0], height=420)
    return fig
