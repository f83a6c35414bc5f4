"""Winner: the user's SLOs, trials ranked by goodput recomputed from stored requests, the margin with its CI."""
import streamlit as st

from dashboard import ui
from qwen3lab.experiment.spec import SLO

st.title("Pick the winner under your SLOs")
df = ui.runs()
ids = list(st.session_state.get("run_ids") or [])
if not ids:
    ui.stop_without_runs(df, "Pick finished runs under **Runs to compare** in the sidebar.")
slo = ui.slo_from_state(df, ids)

# Every SLO kind an experiment can hold, prefilled from its stored SLOs: submitted unchanged unless edited.
PER_REQUEST = (("ttft_ms", "TTFT at most (ms)"), ("tpot_ms", "TPOT at most (ms)"), ("e2el_ms", "E2EL at most (ms)"))
PER_TRIAL = (("ttft_p95_ms", "P95 TTFT at most (ms)"), ("tpot_p95_ms", "P95 TPOT at most (ms)"),
             ("e2el_p99_ms", "P99 E2EL at most (ms)"))
with st.form("slo_form"):
    st.markdown("**Service-level objectives**, from the experiment (leave a box empty for no limit)")
    got = {}
    for title, fields in (("Per request: goodput counts a request only when it meets all of these", PER_REQUEST),
                          ("Per trial: its percentiles over all requests", PER_TRIAL)):
        st.caption(title)
        for col, (field, label) in zip(st.columns(3), fields):
            got[field] = col.number_input(label, min_value=0.0, value=getattr(slo, field), step=10.0, format="%g",
                                          key=f"slo_{field}")
    failed = st.number_input("Failed requests at most (fraction, 0 = none may fail)", min_value=0.0, max_value=1.0,
                             value=slo.max_failed_fraction, step=0.01, format="%g", key="slo_max_failed_fraction")
    applied = st.form_submit_button("Pick the winner", type="primary")
if applied:
    slo = SLO(**{k: v or None for k, v in got.items()}, max_failed_fraction=failed)
    st.session_state.slo = slo.model_dump()
st.caption(f"SLOs in force: {ui.slo_text(slo)}; at most {slo.max_failed_fraction:g} of the requests may fail. A "
           "trial meets the SLOs when its percentiles are within the per-trial limits and no more of its requests "
           "failed than that; goodput counts the requests that meet every per-request limit, per second. "
           "Everything is recomputed from the stored per-request rows: no re-run.")

w = ui.winner_or_stop(ui.db_path(), tuple(ids), slo)
if w.ranking.empty:
    st.warning("None of these runs has stored per-request rows to rank.")
    st.stop()
ui.winner_card(w, slo)
ui.load_point_note(df, ids)
if w.winner is not None and w.winner.row.get("engine_kind") == "vllm":
    if st.button("Export the winner's launch command", icon=":material/terminal:", type="primary"):
        st.session_state.export_run = w.winner.run_id
        st.switch_page("views/export.py")
st.subheader("Ranking")
ui.ranking_table(w.ranking)
st.plotly_chart(ui.pareto(w.ranking, slo), width="stretch", key="pareto-winner")
