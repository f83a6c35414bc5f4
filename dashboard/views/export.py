"""Export: a run as a deployment (the real checkpoint, the winner's flags): shell, docker run, compose, Kubernetes.

The same text as `qwen3lab export RUN --format ...` (both call export.export_run)."""
import streamlit as st

from dashboard import ui
from qwen3lab.errors import Qwen3LabError

st.title("Export the launch command")
df = ui.runs()
launched = df[(df.engine_kind == "vllm") & (df.status == "ok")]
if launched.empty:
    st.info("No finished run that qwen3lab launched: imported runs and endpoints have no launch command to export.")
    st.stop()
ids = list(st.session_state.get("run_ids") or [])
default = st.session_state.get("export_run")
experiment = st.session_state.get("experiment")
if default not in set(launched.run_id) and ui.is_capacity_experiment(df, experiment):
    ranked = ui.capacity_ranking(ui.db_path(), experiment, ui.mtime())  # the winner by capacity
    default = next((r for r in ranked[ranked.capacity.notna() & (ranked.status == "ok")].run_id
                    if isinstance(r, str)), None)
if default not in set(launched.run_id):
    slo = ui.slo_from_state(df, ids)
    w = ui.winner(ui.db_path(), tuple(ids), slo.model_dump_json()) if ids else None
    default = w.winner.run_id if w is not None and w.winner is not None else launched.run_id.iloc[0]
options = list(launched.run_id)
labels = dict(zip(launched.run_id, launched.label + " · " + launched.run_id))  # column-wise: 10,000 runs
c1, c2, c3, c4 = st.columns([3, 2, 1, 1])
run_id = c1.selectbox("Run", options, index=options.index(default) if default in options else 0,
                      format_func=labels.get, help="The winner of the Winner page is picked for you")
model = c2.text_input("Model", key="export_model", placeholder="the measured model's hub checkpoint",
                      help="The checkpoint to deploy. Empty: the hub id of the architecture and quantization that "
                           "was measured (dummy weights measure its speed, not its text)")
host = c3.text_input("Host", "127.0.0.1", key="export_host", help="0.0.0.0 to listen on every interface")
port = int(c4.number_input("Port", min_value=1, max_value=65535, value=8000, key="export_port"))
try:
    ex = ui.export_for(ui.db_path(), run_id, host, port, model.strip() or None)
except Qwen3LabError as exc:
    st.error(str(exc))
    st.stop()
for note in ex.notes:
    st.caption(":material/info: " + note)

shell, docker, compose, k8s = st.tabs(["Shell", "docker run", "Compose", "Kubernetes"])
for tab, fmt, lang, what in (
        (shell, "shell", "bash", "Paste where vLLM is installed (`pip install vllm`): the checkpoint, the winner's flags and env."),
        (docker, "docker", "bash", "Upstream vLLM image (entrypoint `vllm serve`), one GPU, the Hugging Face cache, the env."),
        (compose, "compose", "yaml", "`docker compose up`: the same service, one GPU reserved."),
        (k8s, "kubernetes", "yaml", "`kubectl apply -f`: a Deployment with one GPU and a /health probe, and its Service.")):
    with tab:
        st.caption(what + " Copy with the button at the top right of the box.")
        text = ex.get(fmt)
        st.code(text, language=lang, wrap_lines=True)
        st.download_button(f"Download {ui.export.FILENAMES[fmt].format(run=run_id)}", text,
                           file_name=ui.export.FILENAMES[fmt].format(run=run_id), key=f"dl-{fmt}",
                           icon=":material/download:")
