"""A run's server log or executed notebook, opened from the Runs table (?run=ID&what=log|notebook)."""
import streamlit as st

from dashboard import ui
from qwen3lab.errors import Qwen3LabError

run_id = st.query_params.get("run")
what = st.query_params.get("what", "log")
if not run_id:
    st.info("Open a log or a notebook from the Runs page.")
    st.stop()
if what not in ("log", "notebook"):
    st.error(f"This link asks for `what={what}`: it can be `log` or `notebook`. Fix: open the file from the Runs page.")
    st.page_link("views/runs.py", label="Runs", icon=":material/table_rows:")
    st.stop()
try:
    info = ui.run(ui.db_path(), run_id)
except Qwen3LabError as exc:  # a link to a run this database does not hold: say so, no traceback
    st.error(f"This link names run `{run_id}`, which `{ui.db_path()}` does not hold ({exc}). "
             "Fix: open the log or notebook from the Runs page of the database that holds the run.")
    st.page_link("views/runs.py", label="Runs", icon=":material/table_rows:")
    st.stop()
path = info.get("log_path" if what == "log" else "notebook_path")
st.title(f"{what.capitalize()} of {ui.compare.run_label(info)}")
st.caption(f"run {run_id} · `{path}`")
found = ui.resolve_file(path)
if found is None:
    st.warning(f"`{path}` is not on this machine (the run was made elsewhere, or the file was removed).")
    st.stop()
st.download_button(f"Download {found.name}", found.read_bytes(), file_name=found.name, icon=":material/download:")
if what == "notebook":
    html = ui.notebook_html(found)
    if html:
        st.components.v1.html(html, height=900, scrolling=True)
    else:
        st.info("nbconvert is not installed here: download the notebook to read it.")
else:
    text = ui.read_text_tail(path)
    st.caption("The end of the log (the end says why a server stopped).")
    st.code(text or "", language="log", wrap_lines=True, height=700)
