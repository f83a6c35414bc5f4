"""Drift: soaks (`qwen3lab soak`) window by window, their restarts, and the last window against the first."""
import json

import pandas as pd
import streamlit as st

from dashboard import ui
from qwen3lab.analysis import drift, plots
from qwen3lab.errors import Qwen3LabError

st.title("Drift")
try:
    soaks = ui.store().soaks()
except Qwen3LabError as exc:
    ui.stop_with(exc)
if soaks.empty:
    st.info("No soak yet. `qwen3lab soak EXPERIMENT.yaml --duration 1h` keeps one configuration under the "
            "experiment's traffic, restarts a server that dies, and stores every window; the recipes' 72-hour "
            "claim is `--duration 72h`.")
    st.stop()

st.caption("A soak is a run per window on one server; a server that died was started again (counted). "
           "Drift: the change from the first ok window to the last along a line through every window, with its "
           "95% interval (t over the windows, docs/statistics.md); drift only where it holds after Holm's correction "
           "over the metrics and three or more windows were ok, else noise.")
table = soaks.assign(configuration=soaks.chapter + "/" + soaks.trial)
ui.table(table[["configuration", "status", "duration_s", "window_s", "windows", "server_starts", "crashes",
                    "ooms", "elapsed_s", "reason", "soak_id"]],
             column_config={"duration_s": st.column_config.NumberColumn("duration s", format="%.0f"),
                            "window_s": st.column_config.NumberColumn("window s", format="%.0f"),
                            "elapsed_s": st.column_config.NumberColumn("elapsed s", format="%.0f")})
names = dict(zip(table.soak_id, table.configuration + " · " + table.soak_id))
soak_id = st.selectbox("Soak", list(table.soak_id), format_func=lambda s: names.get(s, s), key="drift_soak")
row = table[table.soak_id == soak_id].iloc[0]
found = json.loads(row.drift_json) if isinstance(row.drift_json, str) else {}
if found.get("metrics"):
    st.subheader("Last window against the first")
    ui.table(pd.DataFrame([{"metric": m, "first window": v["first"], "last window": v["last"],
                                "change %": v["change_pct"], "low %": v["low"], "high %": v["high"],
                                "verdict": "drift" if m in found.get("drift", []) else "noise"}
                               for m, v in found["metrics"].items()]))
elif found.get("note"):
    st.info(found["note"])
windows = drift.windows(ui.store(), soak_id)
st.plotly_chart(plots.soak_figure(windows), width="stretch")
with st.expander("Windows"):
    ui.table(windows)
