"""The History figure: one trial's metric over campaigns (date on the x axis, vLLM build as colour), each point
with its launch-to-launch interval, and each change beyond noise marked with what changed (analysis/history.py)."""
from __future__ import annotations

import pandas as pd

from qwen3lab.analysis import compare

TITLES = {"goodput": "goodput (req/s)", "output_throughput": "output throughput (tok/s)",
          "p95_ttft_ms": "P95 TTFT (ms)"}
CAMPAIGN_TRACE = "campaigns"  # the meta of every trace of campaign points (the browser test counts them)


def history_figure(rows: pd.DataFrame, trial: str, metric: str):
    """`rows`: history.history's rows. One trace per build; a red (worse) or green (better) ring and a note on
    each campaign whose step from the one before moved beyond noise."""
    import plotly.graph_objects as go

    df = rows[(rows.trial == trial) & (rows.metric == metric)].copy()
    fig = go.Figure()
    if df.empty:
        fig.add_annotation(text="no campaign measured this", showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        return fig
    df["when"] = pd.to_datetime(df.started_at, utc=True)
    df = df.sort_values("when")
    fig.add_trace(go.Scatter(x=df.when, y=df.value, mode="lines", line={"color": "lightgray"}, hoverinfo="skip",
                             showlegend=False))
    for build, g in df.groupby("build", sort=False):
        fig.add_trace(go.Scatter(
            x=g.when, y=g.value, mode="markers", name=build, meta=CAMPAIGN_TRACE, marker={"size": 11},
            error_y={"type": "data", "symmetric": False, "array": (g.value_high - g.value).clip(lower=0),
                     "arrayminus": (g.value - g.value_low).clip(lower=0)},
            customdata=g[["campaign_id", "launches", "verdict"]].values,
            hovertemplate="%{customdata[0]}<br>%{y:.4g} (%{customdata[1]} launches)<br>%{customdata[2]}<extra>%{fullData.name}</extra>"))
    for r in df[df.marked].to_dict("records"):
        color = "red" if r["verdict"] == "worse" else "green"
        fig.add_trace(go.Scatter(x=[r["when"]], y=[r["value"]], mode="markers", showlegend=False, hoverinfo="skip",
                                 marker={"size": 22, "color": "rgba(0,0,0,0)", "line": {"color": color, "width": 3}}))
        fig.add_annotation(x=r["when"], y=r["value"], ay=-50, text=f"{r['verdict']} {r['change_pct']:+.0f}% vs "
                           f"{r['previous']}<br>{_short(r['changed'])}", font={"color": color}, align="left")
    higher = compare.METRICS.get(metric, True)
    fig.update_layout(title=f"{trial}: {TITLES.get(metric, metric)} by campaign ({'higher' if higher else 'lower'} "
                      "is better; bars: 95% interval over the campaign's launches)", xaxis_title="campaign started",
                      yaxis_title=TITLES.get(metric, metric), legend_title="vLLM build", height=420)
    return fig


def _short(text: str, width: int = 90) -> str:
    text = text or "nothing recorded changed"
    return text if len(text) <= width else text[: width - 1] + "…"
