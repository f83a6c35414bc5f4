"""Export: a run's launch command as a shell command, docker run, a compose service, a Kubernetes Deployment."""
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
if default not in set(launched.run_id):
    slo = ui.slo_from_state(df, ids)
    w = ui.winner(ui.db_path(), tuple(ids), slo.model_dump_json()) if ids else None
    default = w.winner.run_id if w is not None and w.winner is not None else launched.run_id.iloc[0]
options = list(launched.run_id)
labels = {r.run_id: f"{r.label} · {r.run_id}" for r in launched.itertuples()}
c1, c2, c3 = st.columns([3, 1, 1])
run_id = c1.selectbox("Run", options, index=options.index(default) if default in options else 0,
                      format_func=labels.get, help="The winner of the Winner page is picked for you")
host = c2.text_input("Host", "127.0.0.1", help="0.0.0.0 to listen on every interface")
port = int(c3.number_input("Port", min_value=1, max_value=65535, value=8000))
try:
    ex = ui.export_for(ui.db_path(), run_id, host, port)
except Qwen3LabError as exc:
    st.error(str(exc))
    st.stop()
for note in ex.notes:
    st.caption(":material/info: " + note)

shell, docker, compose, k8s = st.tabs(["Shell", "docker run", "Compose", "Kubernetes"])
for tab, fmt, lang, what in (
        (shell, "shell", "bash", "Paste on the machine that measured it: the same vLLM build, flags, env and NUMA binding."),
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
