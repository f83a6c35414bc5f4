"""Starting the Streamlit dashboard (dashboard/app.py beside this package) on a chosen address and database."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

from qwen3lab.errors import Qwen3LabError, require


def app_path() -> Path:
    path = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
    if not path.is_file():
        raise Qwen3LabError(f"no dashboard at {path}: the dashboard ships with the qwen3lab repository. "
                            "Fix: install qwen3lab from a clone (pip install -e .) and run it from there")
    return path


def dashboard_argv(db: str, host: str = "127.0.0.1", port: int = 8501) -> list[str]:
    # Headless and without usage statistics: nothing is sent anywhere, and no browser is opened on a server.
    # A minimal toolbar: Streamlit's own Deploy button has no place in a tool whose product is a deployment.
    return [sys.executable, "-m", "streamlit", "run", str(app_path()), "--server.address", host,
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "minimal", "--", "--db", str(Path(db).expanduser().resolve())]


def run_dashboard(db: str, host: str = "127.0.0.1", port: int = 8501) -> int:
    """Run Streamlit as a child and stop it however this process is stopped: Ctrl-C reaches the whole process
    group, but a process manager's SIGTERM (`docker stop`, systemd, a test harness) reaches only this process,
    and a SIGKILL none at all: the child then gets SIGTERM from the kernel (PR_SET_PDEATHSIG), so neither a
    process nor the port is left behind."""
    require("streamlit", "pip install 'streamlit>=1.40'")
    print(f"qwen3lab dashboard on http://{host}:{port} reading {db} (Ctrl-C stops it)", flush=True)
    child = subprocess.Popen(dashboard_argv(db, host, port), env={**os.environ, "QWEN3LAB_DB": str(db)},
                             preexec_fn=_die_with_parent)

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return child.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
