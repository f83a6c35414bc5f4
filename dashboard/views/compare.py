"""Compare: the answer first (Pareto chart, winner card), then latency CDFs, request classes, server, GPU, roofline."""
import pandas as pd
import streamlit as st

from dashboard import ui
from qwen3lab.analysis import plots

st.title("Compare runs")
df = ui.runs()
ids = list(st.session_state.get("run_ids") or [])
if len(ids) < 2:
    ui.stop_without_runs(df, "Pick two or more finished runs under **Runs to compare** in the sidebar.")
slo = ui.slo_from_state(df, ids)
w = ui.winner_or_stop(ui.db_path(), tuple(ids), slo)
labels = dict(zip(df.run_id, df.label))

left, right = st.columns([3, 2], gap="large")
with left:
    ranked = w.ranking if not w.ranking.empty else df[df.run_id.isin(ids)]
    st.plotly_chart(ui.pareto(ranked, slo), width="stretch", key="pareto")
with right:
    ui.winner_card(w, slo)
    ui.load_point_note(df, ids)
    st.page_link("views/winner.py", label="Change the SLOs on the Winner page", icon=":material/tune:")
    st.page_link("views/export.py", label="Export the winner's launch command", icon=":material/terminal:")
missing = sorted(set(ids) - set(w.ranking.run_id if not w.ranking.empty else []))
if missing:
    st.caption("Not ranked (no stored per-request rows): " + ", ".join(labels.get(i, i) for i in missing))



def latency_cdfs():
    reqs = ui.requests(ui.db_path(), tuple(ids))
    for col, metric in zip(st.columns(3), ("ttft", "tpot", "e2el")):
        fig = ui.legend_below(plots.cdf_figure(reqs, metric, labels), height=460)
        col.plotly_chart(fig, width="stretch", key=f"cdf-{metric}")
    st.caption("Each line is one run's measured requests (warmup excluded); further left is faster. "
               "TPOT = (E2EL − TTFT) / (output tokens − 1), as vllm bench serve defines it.")


def request_classes():
    reqs = ui.requests(ui.db_path(), tuple(ids))
    metric = st.segmented_control("Latency", ["ttft", "tpot", "e2el"], default="ttft", key="class_metric",
                                  format_func=plots.LATENCY_LABELS.get)
    st.plotly_chart(plots.class_figure(reqs, labels, metric or "ttft"), width="stretch", key="classes")
    if not reqs.empty and reqs.request_class.nunique() == 1:
        st.caption(f"This workload has one request class ({reqs.request_class.iloc[0]}); a mix such as "
                   "`recipe-mix` (chat / summary / long_document) shows one box per class.")


def server_metrics():
    samp = ui.samples(ui.db_path(), tuple(ids))
    st.plotly_chart(plots.timeseries_figure(samp, labels, plots.SERVER_SERIES), width="stretch", key="server")
    st.caption("Scraped from each server's /metrics during the load; t = 0 is the first measured request.")


def gpu_samples():
    samp = ui.samples(ui.db_path(), tuple(ids))
    st.plotly_chart(plots.timeseries_figure(samp, labels, plots.GPU_SERIES), width="stretch", key="gpu")
    st.caption("NVML samples of the GPU the server ran on (none on a machine without an NVIDIA GPU).")


def pct(v) -> str:
    return "-" if v is None or v != v else f"{v:.0%}"


def roofline():
    ceil = ui.ceilings(ui.db_path(), tuple(ids))
    have = ceil[ceil.available.astype(bool)].reset_index(drop=True)
    if have.empty:
        st.info("No roofline for these runs: " + "; ".join(sorted(set(ceil.why.dropna()))) + ". "
                "`qwen3lab plan --gpu a100-80g` shows the ceilings a GPU would give.")
        return
    st.plotly_chart(plots.ceiling_figure(have, labels), width="stretch", key="roofline")
    ui.table(pd.DataFrame({
        "run": [labels.get(r, r) for r in have.run_id], "GPU": have.gpu, "batch": have.batch.round(1),
        "batch from": have.batch_source, "bound": have.bound,
        "output tok/s": have.output_tok_s.round(1), "ceiling tok/s": have.output_tok_s_ceiling.round(1),
        "efficiency": have.output_efficiency.map(pct),
        "decode step ≥ (ms)": have.decode_step_ms_ceiling.round(2), "TPOT efficiency": have.tpot_efficiency.map(pct),
        "TTFT ≥ (ms)": have.ttft_ms_ceiling.round(1), "TTFT efficiency": have.ttft_efficiency.map(pct),
    }), key="roofline_table")
    st.caption("Ceiling: the larger of (weights + KV bytes each decode step reads) / memory bandwidth and "
               "FLOPs / tensor rate, from the GPU catalogue's datasheet figures; efficiency = measured / ceiling "
               "(TPOT and TTFT: floor / measured). A figure above 100% means the catalogue or the run is wrong.")
    for rid, why in zip(ceil.run_id, ceil.why) if "why" in ceil else []:
        if isinstance(why, str):
            st.caption(f"{labels.get(rid, rid)}: no ceiling ({why}).")


# Only the open tab is drawn and only its rows are read: the page stays fast on a big store.
SECTIONS = {"Latency CDFs": latency_cdfs, "By request class": request_classes, "Server metrics": server_metrics,
            "GPU": gpu_samples, "Roofline": roofline}
for tab, draw in zip(st.tabs(list(SECTIONS), key="compare_tab", on_change="rerun"), SECTIONS.values()):
    if tab.open:
        with tab:
            draw()
