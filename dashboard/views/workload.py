"""Workload: what the picked runs sent (their stored requests): lengths, arrivals over time, turns per session."""
import streamlit as st

from dashboard import ui
from qwen3lab.traffic.figures import workload_figure

st.title("Workload")
df = ui.runs()
ids = list(st.session_state.get("run_ids") or [])
if not ids:
    ui.stop_without_runs(df, "Pick runs under **Runs to compare** in the sidebar.")
reqs = ui.requests(ui.db_path(), tuple(ids))
if reqs.empty:
    st.info("The picked runs have no stored requests.")
    st.stop()
labels = dict(zip(df.run_id, df.label))
st.caption("Measured requests only (warm-up left out). A traffic file's runs (docs/traffic.md) show its lengths "
           "as the server counted them and its arrivals as sent; `qwen3lab traffic FILE` describes the file itself.")
st.plotly_chart(workload_figure(reqs, labels), width="stretch", key="workload")
