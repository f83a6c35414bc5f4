"""Claims: each knob change of an experiment against its baseline, on goodput, throughput and TTFT, with a CI."""
import streamlit as st

from dashboard import ui
from qwen3lab.analysis import plots

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
table = claims.copy()
table["change"] = [f"{c:+.1f}% (95% CI {lo:+.1f} .. {hi:+.1f})" if c == c else "–" for c, lo, hi in
                   zip(table.change_pct, table.low_pct, table.high_pct)]
table["metric"] = table.metric.map({"goodput": "goodput (req/s)", "output_throughput": "output throughput (tok/s)",
                                    "p95_ttft_ms": "P95 TTFT (ms, lower is better)", "all": "–"})
st.dataframe(table[["chapter", "trial", "baseline", "metric", "change", "launches", "baseline_launches", "verdict"]],
             hide_index=True,
             width="stretch")
for tab, metric in zip(st.tabs(["Goodput", "Output throughput", "P95 TTFT"]),
                       ("goodput", "output_throughput", "p95_ttft_ms")):
    with tab:
        st.plotly_chart(plots.effects_figure(claims, metric), width="stretch", key=f"fx-{metric}")
