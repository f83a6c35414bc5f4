"""Runs: every stored run with its key metrics, filtered; failed and skipped ones with their reason."""
from urllib.parse import urlencode

import streamlit as st

from dashboard import ui

st.title("Runs")
df = ui.runs()
FILTERS = [("experiment", "Experiment"), ("chapter", "Chapter"), ("gpu", "GPU"), ("model", "Model"),
           ("vllm_version", "vLLM version"), ("status", "Status")]
cols = st.columns(len(FILTERS))
view = df
for col, (name, title) in zip(cols, FILTERS):
    values = sorted(df[name].fillna("–").astype(str).unique())
    chosen = col.multiselect(title, values, key=f"filter_{name}", placeholder="all")
    if chosen:
        view = view[view[name].fillna("–").astype(str).isin(chosen)]

view = view.copy()
if "validity" not in view:  # a database of an older schema
    view["validity"] = None
view["log"] = [f"file?{urlencode({'run': r, 'what': 'log'})}" if isinstance(p, str) and p else None
               for r, p in zip(view.run_id, view.log_path)]
view["notebook"] = [f"file?{urlencode({'run': r, 'what': 'notebook'})}"
                    if isinstance(p, str) and p else None for r, p in zip(view.run_id, view.notebook_path)]
done = (view.status == "ok").sum()
st.caption(f"{len(view)} of {len(df)} runs · {done} finished · newest first. Latencies in ms, per measured "
           "request (warmup excluded).")
# When and on which vLLM first (they decide what a row can be compared with), then the figures; units in headers
COLUMNS = {
    "started_at": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm", pinned=True),
    "label": st.column_config.TextColumn("trial", width="large", pinned=True,
                                         help="CHAPTER/TRIAL; hover a cell for the whole name"),
    "status": st.column_config.TextColumn("status", width=90), "vllm_version": st.column_config.TextColumn("vLLM", width=70),
    "output_throughput": st.column_config.NumberColumn("output (tok/s)", format="%.0f"),
    "request_throughput": st.column_config.NumberColumn("requests (req/s)", format="%.2f"),
    "request_goodput": st.column_config.NumberColumn("goodput (req/s)", format="%.2f", help="under the experiment's SLOs"),
    "median_ttft_ms": st.column_config.NumberColumn("TTFT p50 (ms)", format="%.0f"),
    "p95_ttft_ms": st.column_config.NumberColumn("TTFT p95 (ms)", format="%.0f", help="every measured request"),
    "steady_p95_ttft_ms": st.column_config.NumberColumn(
        "TTFT p95 steady (ms)", format="%.0f",
        help="without the opening burst: the first `concurrency` requests of a closed loop, sent at once on an idle server"),
    "p95_tpot_ms": st.column_config.NumberColumn("TPOT p95 (ms)", format="%.1f"),
    "p99_e2el_ms": st.column_config.NumberColumn("E2EL p99 (ms)", format="%.0f"),
    "completed": st.column_config.NumberColumn("ok (requests)"), "failed": st.column_config.NumberColumn("failed (requests)"),
    "planner_kv_tokens": st.column_config.NumberColumn("KV tokens (planner)", format="%d",
                                                       help="KV cache capacity the planner predicted in pre-flight"),
    "vllm_kv_tokens": st.column_config.NumberColumn("KV tokens (vLLM)", format="%d",
                                                    help="KV cache capacity vLLM reported at start-up"),
    "log": st.column_config.LinkColumn("server log", display_text="log"),
    "notebook": st.column_config.LinkColumn("notebook", display_text="notebook"),
    "reason": st.column_config.TextColumn("reason", width="medium"),
    "validity": st.column_config.TextColumn("measurement", width="medium",
                                            help="'unreliable: …' when the client, not the server, set the numbers"),
    "experiment": "experiment", "gpu": "GPU", "model": "model",
    "run_id": "run",
}
picked = ui.table(view[list(COLUMNS)], links=("log", "notebook"), column_config=COLUMNS,
                      on_select="rerun", selection_mode="multi-row", key="runs_table", height=min(35 * (len(view) + 1) + 3, 560))
rows = picked.selection.rows if picked is not None and hasattr(picked, "selection") else []
chosen = list(view.run_id.iloc[rows]) if rows else []
if chosen:
    status = dict(zip(df.run_id, df.status))
    ok = [r for r in chosen if status.get(r) == "ok"]
    if len(ok) >= 2 and st.button(f"Compare these {len(ok)} runs", type="primary", icon=":material/compare_arrows:"):
        exps = df[df.run_id.isin(ok)].experiment.dropna().unique()
        ui.compare_runs(exps[0] if len(exps) == 1 else ui.ALL, ok)

unfinished = view[view.status != "ok"]
if not unfinished.empty:
    st.subheader(f"Did not finish ({len(unfinished)})")
    for r in unfinished.itertuples():
        icon = {"skipped": ":material/skip_next:", "running": ":material/hourglass_top:"}.get(r.status, ":material/error:")
        st.markdown(f"{icon} **{r.label}** · `{r.status}` · {r.run_id}  \n{r.reason or 'no reason recorded'}")

st.subheader("One run in detail")
names = {r: f"{lab} · {r}" for r, lab in zip(view.run_id, view.label)}
detail = chosen[0] if chosen else st.selectbox("Run", list(names), key="detail_run", format_func=names.get)
if detail:
    info = ui.run(ui.db_path(), detail)
    c1, c2 = st.columns(2)
    c1.markdown(f"**status** `{info['status']}` · **engine** {info.get('engine_kind')} · **vLLM** "
                f"{info.get('vllm_version') or '–'} · **torch** {info.get('torch_version') or '–'}")
    c1.markdown(f"**config hash** `{(info.get('config_hash') or '–')[:16]}` · **git** `{info.get('git_commit') or '–'}` "
                f"· **host** {info.get('host') or '–'} · **GPU** {info.get('gpu') or '–'}")
    if info.get("reason"):
        c1.warning(info["reason"])
    if info.get("launch_command"):
        c1.code(info["launch_command"], language="bash", wrap_lines=True)
    if (imp := (info.get("info") or {}).get("import")):
        c1.markdown(f"Imported from **{imp['tool']}** {imp.get('tool_version') or ''}: `{imp['path']}`")
    for what, key in (("log", "log_path"), ("notebook", "notebook_path")):
        if info.get(key):
            found = ui.resolve_file(info[key])
            c2.markdown(f"**{what}**: `{info[key]}`" + ("" if found else " (not on this machine)"))
            if found:
                c2.page_link("views/file.py", label=f"Open the {what}", icon=":material/open_in_new:",
                             query_params={"run": detail, "what": what})
