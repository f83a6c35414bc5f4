"""The workload a run sent, from its stored request rows: prompt and output length histograms, arrivals over
time, and turns per session (the dashboard's Workload page)."""
from __future__ import annotations

import pandas as pd


def workload_figure(reqs: pd.DataFrame, labels: dict[str, str] | None = None, bins: int = 30):
    """Four panels, one trace per run: prompt tokens, output tokens, sends per second, turns per session."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=2, subplot_titles=("prompt tokens (server's count)", "output tokens",
                                                        "requests sent per second", "turns per session"))
    labels = labels or {}
    for run_id, rows in reqs.groupby("run_id", sort=False):
        name = labels.get(run_id, run_id)
        # plain lists: the chart's JSON then carries the values themselves (plotly packs numpy arrays)
        prompt = rows.prompt_tokens.fillna(rows.prompt_tokens_target).astype(float).tolist()
        output = rows.output_tokens.fillna(rows.output_tokens_target).astype(float).tolist()
        fig.add_trace(go.Histogram(x=prompt, nbinsx=bins, name=name, legendgroup=name, opacity=0.6), 1, 1)
        fig.add_trace(go.Histogram(x=output, nbinsx=bins, name=name, legendgroup=name, opacity=0.6,
                                   showlegend=False), 1, 2)
        sent = rows.sent_at.dropna()
        if len(sent):
            per_s = sent.astype(int).value_counts().sort_index()
            fig.add_trace(go.Scatter(x=per_s.index.tolist(), y=per_s.values.tolist(), mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=False), 2, 1)
        if "session" in rows and rows.session.notna().any():
            turns = rows.dropna(subset=["session"]).groupby("session").size()
            fig.add_trace(go.Histogram(x=turns.tolist(), name=name, legendgroup=name, opacity=0.6, showlegend=False), 2, 2)
    fig.update_layout(barmode="overlay", height=620, margin={"t": 40})
    fig.update_xaxes(title_text="seconds since the load began", row=2, col=1)
    return fig
