"""Winner: the user's SLOs, trials ranked by goodput recomputed from stored requests, the margin with its CI."""
import streamlit as st

from dashboard import ui
from qwen3lab.experiment.spec import SLO

st.title("Pick the winner under your SLOs")
df = ui.runs()
ids = list(st.session_state.get("run_ids") or [])
if not ids:
    st.info("Pick finished runs under **Runs to compare** in the sidebar.")
    st.stop()
slo = ui.slo_from_state(df, ids)

with st.form("slo_form"):
    st.markdown("**Service-level objectives** (leave a box empty for no limit)")
    c1, c2, c3 = st.columns(3)
    ttft = c1.number_input("P95 TTFT at most (ms)", min_value=0.0, value=slo.ttft_p95_ms, step=50.0, format="%.0f", key="slo_ttft")
    tpot = c2.number_input("P95 TPOT at most (ms)", min_value=0.0, value=slo.tpot_p95_ms, step=5.0, format="%.1f", key="slo_tpot")
    e2el = c3.number_input("P99 E2EL at most (ms)", min_value=0.0, value=slo.e2el_p99_ms, step=100.0, format="%.0f", key="slo_e2el")
    applied = st.form_submit_button("Pick the winner", type="primary")
if applied:
    slo = SLO(ttft_p95_ms=ttft or None, tpot_p95_ms=tpot or None, e2el_p99_ms=e2el or None,
              max_failed_fraction=slo.max_failed_fraction)
    st.session_state.slo = slo.model_dump()
st.caption("A trial meets the SLOs when its P95 TTFT, P95 TPOT and P99 E2EL are within them and no more of its "
           f"requests failed than max_failed_fraction ({slo.max_failed_fraction:g}). Goodput counts the "
           "requests whose own TTFT, TPOT and E2EL are within the same limits, per second. Everything is "
           "recomputed from the stored per-request rows: no re-run.")

w = ui.winner_or_stop(ui.db_path(), tuple(ids), slo)
if w.ranking.empty:
    st.warning("None of these runs has stored per-request rows to rank.")
    st.stop()
ui.winner_card(w, slo)
if w.winner is not None and w.winner.row.get("engine_kind") == "vllm":
    if st.button("Export the winner's launch command", icon=":material/terminal:", type="primary"):
        st.session_state.export_run = w.winner.run_id
        st.switch_page("views/export.py")
st.subheader("Ranking")
ui.ranking_table(w.ranking)
st.plotly_chart(ui.pareto(w.ranking, slo), width="stretch", key="pareto-winner")
