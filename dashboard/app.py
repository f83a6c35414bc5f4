"""qwen3lab dashboard: compare runs, pick the winner under SLOs, export its launch command.

    qwen3lab dashboard [--db PATH] [--port N]
    streamlit run dashboard/app.py -- --db PATH        (or QWEN3LAB_DB=PATH)

Every page reads DuckDB through qwen3lab.store only, briefly, so a sweep can write the same file meanwhile.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))  # this checkout's qwen3lab, not another one installed elsewhere

import streamlit as st  # noqa: E402

from dashboard import ui  # noqa: E402

st.set_page_config(page_title="qwen3lab", page_icon=":material/science:", layout="wide")
HERE = Path(__file__).parent
# Every query of this render on one open of the file (ui.one_open_file): released when the render ends.
with ui.one_open_file():
    capacity_first = ui.opens_on_capacity()  # a capacity experiment's answer is its capacity ranking
    pages = [
        st.Page(HERE / "views/runs.py", title="Runs", icon=":material/table_rows:", url_path="runs"),
        st.Page(HERE / "views/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare",
                default=not capacity_first),
        st.Page(HERE / "views/winner.py", title="Winner", icon=":material/trophy:", url_path="winner"),
        st.Page(HERE / "views/export.py", title="Export", icon=":material/terminal:", url_path="export"),
        st.Page(HERE / "views/claims.py", title="Claims", icon=":material/fact_check:", url_path="claims"),
        st.Page(HERE / "views/capacity.py", title="Capacity", icon=":material/speed:", url_path="capacity",
                default=capacity_first),
        st.Page(HERE / "views/drift.py", title="Drift", icon=":material/timeline:", url_path="drift"),
        st.Page(HERE / "views/history.py", title="History", icon=":material/history:", url_path="history"),
        st.Page(HERE / "views/workload.py", title="Workload", icon=":material/bar_chart:", url_path="workload"),
        st.Page(HERE / "views/file.py", title="File", url_path="file", visibility="hidden"),
    ]
    page = st.navigation(pages, position="top")
    st.sidebar.markdown("**qwen3lab**: the best `vllm serve` configuration, by measurement")
    st.sidebar.caption(f"Database: `{ui.db_path()}`")
    ui.refresh_button()
    df = ui.runs()
    ui.selection_sidebar(df)
    page.run()
