"""Claims: each knob change of an experiment against its baseline, on goodput, throughput and TTFT, with a CI."""
import streamlit as st

from dashboard import ui
from qwen3lab.analysis import plots, wording

st.title("Claims: does each knob change help?")
df = ui.runs()
exps = list(df[df.engine_kind != "import"].experiment.dropna().unique())
if not exps:
    st.info("No experiment with chapters and baselines yet.")
    st.stop()
cur = st.session_state.get("experiment")
exp = st.selectbox("Experiment", exps, index=exps.index(cur) if cur in exps else 0, key="claims_experiment")
slo = ui.slo_from_state(df, list(df[df.experiment == exp].run_id))
st.caption(f"Each trial (all its launches) against its chapter's baseline with the same comparability key (same "
           f"requests, tokenizer, machine, build). Goodput under {ui.slo_text(slo)}. The interval is Welch's t over "
           "the launches' figures; a change is better or worse only when it holds after Holm's correction across the "
           "chapter's trials and metrics, else can't tell; a trial or baseline of one launch gets no verdict "
           "(docs/statistics.md).")
claims = ui.claims(ui.db_path(), exp, slo.model_dump_json(), ui.mtime())
if claims.empty:
    st.info("No trial of this experiment has a finished baseline to compare against.")
    st.stop()
# The verdict first; a trial without a comparable baseline says why in the last column
ui.table(wording.claims_table(claims), column_config={
    "verdict": st.column_config.TextColumn("verdict", width=320, pinned=True),  # "one launch: launch-to-launch spread unknown" whole
    "trial": st.column_config.TextColumn("trial", pinned=True),
    "launches": st.column_config.NumberColumn("launches", width="small"),
    "baseline launches": st.column_config.TextColumn("baseline launches", width="small"),
    "why not compared": st.column_config.TextColumn("why not compared", width="large"),
})
for tab, metric in zip(st.tabs(["Goodput", "Output throughput", "P95 TTFT"]),
                       ("goodput", "output_throughput", "p95_ttft_ms")):
    with tab:
        st.plotly_chart(plots.effects_figure(claims, metric), width="stretch", key=f"fx-{metric}")
