"""Capacity: each configuration's largest load within the SLOs, its load curves, and adaptive searches."""
import json

import pandas as pd
import streamlit as st

from dashboard import ui
from qwen3lab.analysis import plots
from qwen3lab.errors import Qwen3LabError
from qwen3lab.measure import capacity as cap

st.title("Capacity")
try:
    searches = ui.store().capacities()
    studies = ui.store().search_trials()
except Qwen3LabError as exc:
    ui.stop_with(exc)
if searches.empty and studies.empty:
    st.info("No capacity measured yet. `qwen3lab capacity EXPERIMENT.yaml` measures each trial's capacity on one "
            "server; `qwen3lab search EXPERIMENT.yaml` searches launch flags by capacity (see "
            "experiments/cpu-tiny-search.yaml).")
    st.stop()

if not searches.empty:
    experiments = sorted(searches.experiment.dropna().unique())
    here = st.session_state.get("experiment")
    experiment = st.selectbox("Experiment", experiments, key="capacity_experiment",
                              index=experiments.index(here) if here in experiments else 0)
    # Each configuration's newest searches (as many launches as it asked for) stand for it; ranked by capacity.
    ranked = ui.capacity_ranking(ui.db_path(), experiment, ui.mtime())
    ui.capacity_winner_card(ranked)
    st.caption("Capacity = the largest offered load whose point met the SLOs; the bracket is that point and the "
               "first failing one above it. One server served every point of a search; with `capacity.launches` "
               "above 1, the capacity is the median of that many launches and the bracket spans all of them.")
    axes = ranked.axis.dropna().unique()
    unit = ui.AXIS_UNITS.get(axes[0], axes[0]) if len(axes) == 1 else "load"
    ui.table(ranked[["trial", "capacity", "low", "high", "status", "chapter", "axis", "launches", "points",
                                   "start_s", "measure_s", "reason", "search_id"]],
                 column_config={"trial": st.column_config.TextColumn("trial", width="medium", pinned=True),
                                "capacity": st.column_config.NumberColumn(f"capacity ({unit})", format="%g"),
                                "low": st.column_config.NumberColumn(f"last pass ({unit})", format="%g"),
                                "high": st.column_config.NumberColumn(f"first fail ({unit})", format="%g"),
                                "start_s": st.column_config.NumberColumn("start (s)", format="%.0f",
                                                                          help="process start to /health"),
                                "measure_s": st.column_config.NumberColumn("load (s)", format="%.0f")})
    names = dict(zip(ranked.search_id, ranked.chapter + "/" + ranked.trial))
    shown = st.multiselect("Configurations", list(ranked.search_id), default=list(ranked.search_id[:6]),
                           format_func=lambda s: names.get(s, s), key="capacity_searches")
    metric = st.radio("Metric", list(plots.CURVE_METRICS), horizontal=True, key="capacity_metric",
                      format_func=lambda m: plots.CURVE_METRICS[m])
    points = ui.store().capacity_points(shown) if shown else ranked.iloc[0:0]
    chosen = ranked[ranked.search_id.isin(shown)]
    limit = None
    if metric == "attainment" and not chosen.empty:
        limit = float(chosen.min_attainment.iloc[0])
    elif not points.empty and metric in ("p95_ttft_ms", "p95_tpot_ms", "p99_e2el_ms"):
        slo = json.loads(points.slo_json.dropna().iloc[0]) if points.slo_json.notna().any() else {}
        key = {"p95_ttft_ms": ("ttft_p95_ms", "ttft_ms"), "p95_tpot_ms": ("tpot_p95_ms", "tpot_ms"),
               "p99_e2el_ms": ("e2el_p99_ms", "e2el_ms")}[metric]
        limit = next((slo[k] for k in key if slo.get(k)), None)
    st.plotly_chart(plots.load_curve_figure(points, chosen, metric, limit), width="stretch")
    if not points.empty:
        st.subheader("Load points")
        st.caption("Each point is judged on its steady window (arrivals after the ramp-up, before the tail): it "
                   "fails by flow (served below offered), queue (vLLM's or the client's queue grows: slope and "
                   "one-sided p) or slo; a transient point was too short to show a steady state and decides nothing.")
        rows = pd.DataFrame([{"configuration": names.get(sid, sid)} | p.row() for sid, p in zip(
            points.search_id, cap.stored_points(points))])
        for side in ("server", "client"):  # None where a point had no window (or was stored before there were)
            for key in ("slope", "p"):
                rows[f"{side} queue {key}"] = [((q or {}).get(side) or {}).get(key) for q in rows.queue_trend]
        ui.table(rows[["configuration", "index", "load", "passed", "offered_rate", "served_rate", "goodput_rate",
                           "steady_s", "server queue slope", "server queue p", "client queue slope", "client queue p",
                           "attainment", "why"]],
                     column_config={"steady_s": st.column_config.NumberColumn("steady window (s)", format="%.0f"),
                                    "configuration": st.column_config.TextColumn("configuration", width="medium",
                                                                                 pinned=True),
                                    "offered_rate": st.column_config.NumberColumn("offered (req/s)", format="%.3g"),
                                    "served_rate": st.column_config.NumberColumn("served (req/s)", format="%.3g"),
                                    "goodput_rate": st.column_config.NumberColumn("goodput (req/s)", format="%.3g"),
                                    "attainment": st.column_config.NumberColumn("attainment (share)", format="%.3f")})

if not studies.empty:
    from qwen3lab.measure import search as se

    st.header("Searches")
    study = st.selectbox("Study", list(dict.fromkeys(studies.study)), key="capacity_study")
    history = studies[studies.study == study]
    done = history[history.state == "complete"]
    counts = history.state.value_counts().to_dict()
    st.caption(" · ".join(f"{n} {s}" for s, n in counts.items()) + ". Pruned suggestions were judged infeasible "
               "by pre-flight and never launched.")
    if not done.empty:
        best = done.sort_values(["value", "number"], ascending=[False, True]).iloc[0]
        st.success(f"Best so far: **{best.trial}**, objective {best.value:g}"
                   + (f" (bracket {best.low:g} to {best.high:g})" if best.low == best.low and best.high == best.high
                      else "") + f" · run `{best.run_id}` (export it from the Export page)")
    st.plotly_chart(plots.search_history_figure(history), width="stretch")
    named = history.objectives.dropna() if "objectives" in history else history.iloc[0:0]
    objectives = named.iloc[0].split(",") if not named.empty else []  # rows of older stores name none
    front = [t.number for t in se.pareto_front(objectives, se.trials_of(history))]
    if front:
        st.plotly_chart(plots.search_front_figure(history, front, objectives), width="stretch")
    found = se.importances(history)
    if found:
        st.plotly_chart(plots.bar_figure(
            pd.DataFrame({"flag": list(found), "importance": list(found.values())}),
            "flag", "importance", "Parameter importance (fANOVA)", "share of the objective's variance"),
            width="stretch")
    else:
        st.caption("Parameter importance needs at least three measured configurations with different results.")
    ui.table(history[["number", "trial", "state", "value", "low", "high", "reason", "run_id", "search_id",
                          "wall_s"]])
