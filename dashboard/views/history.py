"""History: each trial's figures over campaigns (`qwen3lab history`), changes beyond noise marked with what
changed, and the campaigns themselves (dates, builds, notebooks kept)."""
import streamlit as st

from dashboard import ui
from qwen3lab import campaign
from qwen3lab.analysis import history, history_plot
from qwen3lab.errors import Qwen3LabError

st.title("History")


@st.cache_data(ttl=ui.TTL_S, show_spinner="Lining the campaigns up ...")
def _history(db: str, experiment: str, include_unreliable: bool, stamp: float):
    return history.history(ui.store(), experiment, include_unreliable=include_unreliable)


try:
    campaigns = campaign.listing(ui.store())
except Qwen3LabError as exc:
    ui.stop_with(exc)
if campaigns.empty:
    st.info("No campaign yet. Every `qwen3lab run`, `sweep` and `capacity` is a campaign (a dated invocation with "
            "its builds and commit); run one twice, or schedule it, and the trials line up here.")
    st.stop()
names = list(dict.fromkeys(campaigns.experiment.dropna()))
experiment = st.selectbox("Experiment", names, index=len(names) - 1, key="history_experiment")
include = st.checkbox("Count launches marked unreliable", value=True, key="history_unreliable",
                      help="On a busy machine many launches are marked unreliable (see Runs); left out, a campaign "
                           "may have too few launches for a verdict.")
try:
    rows = _history(ui.db_path(), experiment, include, ui.mtime())
except Qwen3LabError as exc:
    st.warning(str(exc))
    st.stop()
st.caption("Each point: a campaign's launches of the trial, their mean and its 95% interval (t over the launches). "
           "Each campaign is set against the one before with Welch's t on launch figures, Holm-corrected over the "
           "trial's steps and metrics (docs/statistics.md); a ring marks a change beyond noise, with what changed "
           "between the two campaigns. One launch a side gives no verdict.")
trials = list(dict.fromkeys(rows.trial))
trial = st.selectbox("Trial", trials, key="history_trial")
for metric in dict.fromkeys(rows.metric):
    st.plotly_chart(history_plot.history_figure(rows, trial, metric), width="stretch", key=f"history_{metric}")
marked = rows[(rows.trial == trial) & rows.marked]
st.subheader("Changes beyond noise")
if marked.empty:
    st.write("None: every step between campaigns is within noise (or has one launch a side).")
for r in marked.to_dict("records"):
    st.markdown(f"- **{r['verdict']}**: {r['metric']} {r['change_pct']:+.1f}% (95% CI {r['low_pct']:+.1f} .. "
                f"{r['high_pct']:+.1f}%) in `{r['campaign_id']}` against `{r['previous']}`; what changed: "
                f"`{r['changed'] or 'nothing recorded'}`")
st.subheader("Campaigns")
mine = campaigns[campaigns.experiment == experiment]
ui.table(mine[["campaign_id", "command", "started_at", "ended_at", "status", "reason", "builds", "ok", "runs",
                   "qwen3lab_commit", "experiment_digest", "notebooks"]])
