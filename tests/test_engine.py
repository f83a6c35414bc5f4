"""Launching real vLLM servers: how each ending is told apart, and that nothing is left behind."""
from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from qwen3lab.measure import engine, runner
from qwen3lab.errors import EngineError
from qwen3lab.experiment.spec import EndpointConfig, RequestClass, Trial

from .conftest import small_workload, spooled_requests, tiny_config, vllm_processes


@pytest.fixture
def no_leftovers():
    """Asserts that the test leaves no new vLLM process behind (a shared session server may be running)."""
    before = {p.pid for p in vllm_processes()}
    yield
    deadline = time.monotonic() + 15
    new = lambda: [p for p in vllm_processes() if p.pid not in before]  # noqa: E731
    while new() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert new() == []


def test_unknown_flag_fails_with_the_reason_from_the_log(tmp_path, no_leftovers):
    # A recipe flag that no vLLM has (vllm-facts: max_paddings is not an EngineArg).
    cfg = tiny_config(extra_args=["--max-paddings", "1024"])
    with pytest.raises(EngineError) as info:
        with engine.launch(cfg, tmp_path / "server.log", ready_timeout_s=300):
            pass
    assert info.value.outcome == "failed"
    assert "max-paddings" in info.value.reason and "exit code" in info.value.reason


def test_kv_cache_too_small_is_out_of_memory(tmp_path, no_leftovers):
    # 1 MB of KV cache cannot hold one 2048-token sequence of the tiny model (2 KiB a token).
    # (VLLM_CPU_KVCACHE_SPACE would take precedence over --kv-cache-memory-bytes on the CPU backend.)
    cfg = tiny_config(env={}, extra_args=["--kv-cache-memory-bytes", "1000000"])
    with pytest.raises(EngineError) as info:
        with engine.launch(cfg, tmp_path / "server.log", ready_timeout_s=300):
            pass
    assert info.value.outcome == "oom", info.value.reason
    assert "KV cache" in info.value.reason


def test_health_timeout_tears_down(tmp_path, no_leftovers):
    with pytest.raises(EngineError) as info:
        with engine.launch(tiny_config(), tmp_path / "server.log", ready_timeout_s=3):
            pass
    assert info.value.outcome == "timeout"


def test_endpoint_kind_measures_a_running_server(tiny_server, store, tmp_path):
    cfg = EndpointConfig(kind="endpoint", url=tiny_server.base_url + "/v1", model=tiny_server.model_name,
                         tokenizer=str(engine.resolve_model_path("builtin:qwen3-tiny")))
    trial = Trial(experiment="t", name="endpoint", engine=cfg, workload=small_workload(num_requests=8))
    result = runner.run_trial(trial, store, tmp_path)
    assert result.status == "ok" and result.summary["completed"] == 8
    assert tiny_server.alive()  # measured, never stopped
    row = store.run(result.run_id)
    assert row["engine_kind"] == "endpoint" and row["vllm_version"]


def test_server_killed_mid_run_is_stored_as_crashed(store, tmp_path, no_leftovers):
    """SIGKILL the server during the load: run stored as crashed, finished requests kept, nothing left."""
    w = small_workload(num_requests=400, concurrency=4, mix=[RequestClass(name="s", prompt_tokens=32, output_tokens=32)])
    trial = Trial(experiment="t", name="killed", engine=tiny_config(), workload=w)
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("r", runner.run_trial(trial, store, tmp_path)))
    worker.start()
    deadline = time.monotonic() + 600
    run_id = None
    while time.monotonic() < deadline:
        runs = store.runs()
        if not runs.empty:
            run_id = runs.run_id[0]
            if spooled_requests(tmp_path) >= 20:  # DuckDB has them only after the load
                break
        time.sleep(0.5)
    assert run_id, "the run never started"
    argv = store.run(run_id)["exec_argv"]
    port = int(argv[argv.index("--port") + 1])
    (api,) = [p for p in vllm_processes() if f"--port {port}" in " ".join(p.cmdline())]
    core = api.children(recursive=True)  # engine core and workers: orphaned when the API server dies
    os.kill(api.pid, signal.SIGKILL)
    worker.join(timeout=120)
    assert not worker.is_alive()
    import psutil

    _, alive = psutil.wait_procs(core, timeout=15)
    assert core and not alive, f"the crashed server's engine core or workers outlived it: {alive}"
    result = out["r"]
    row = store.run(run_id)
    assert result.status == row["status"] == "crashed", row["reason"]
    assert "SIGKILL" in row["reason"]
    kept = store.requests([run_id])
    finished = kept[kept.error.isna()]
    # what finished is stored; sending stopped: failed are those in flight (4) and perhaps one sent as it died
    assert len(finished) >= 20 and len(kept) - len(finished) <= 8, kept.error.value_counts()
    assert (finished.output_tokens == 32).all()
    assert engine.port_is_free(port)


def test_stop_leaves_no_process_or_port(tmp_path, no_leftovers):
    with engine.launch(tiny_config(), tmp_path / "server.log", ready_timeout_s=600) as server:
        family = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
        assert len(family) >= 2  # the API server and vLLM's engine core
        port = server.port
        if len(os.sched_getaffinity(0)) >= 2:  # the server off the first core, the client's (cpu_server_pin)
            first = min(os.sched_getaffinity(0))
            assert server.exec_argv[0] == "taskset" and all(first not in p.cpu_affinity() for p in family)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
    assert engine.port_is_free(port)


def test_the_cpu_server_leaves_the_first_core_to_the_client_unless_bound_by_the_user():
    cpu = engine.Build("/usr/bin/python3", "0.32.0", "vllm-cpu", None)
    gpu = engine.Build("/usr/bin/python3", "0.32.0", "vllm", None)
    assert engine.cpu_server_pin(tiny_config(), cpu, {0, 1}) == ["taskset", "--cpu-list", "1"]
    assert engine.cpu_server_pin(tiny_config(), cpu, {2, 5, 7}) == ["taskset", "--cpu-list", "5,7"]
    assert engine.cpu_server_pin(tiny_config(), cpu, {3}) == []  # one core: nothing to leave
    assert engine.cpu_server_pin(tiny_config(), gpu, {0, 1}) == []  # a GPU server: not touched
    bound = tiny_config(env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"})
    assert engine.cpu_server_pin(bound, cpu, {0, 1}) == []  # the user's binding stands


LAUNCHER = """
import sys, time
from pathlib import Path
from qwen3lab.measure import engine
from tests.conftest import tiny_config
with engine.launch(tiny_config(), Path(sys.argv[1]), ready_timeout_s=600) as server:
    print(server.process.pid, flush=True)
    time.sleep(600)
"""


def test_launcher_killed_with_its_children_leaves_no_engine_core(tmp_path):
    """Ray kills a dead worker's direct children with SIGKILL: the API server gets no time to stop its engine
    core and workers (grandchildren). The launch's guard ends the whole group: nothing is left."""
    import subprocess
    import sys

    from .conftest import REPO

    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path / "server.log")], cwd=REPO,
                                stdout=subprocess.PIPE, text=True)
    api_pid = 0

    def group():  # the server's process group: the API server, its engine core and workers (ps names them VLLM::)
        out = []
        for p in psutil.process_iter():
            try:
                if api_pid and os.getpgid(p.pid) == api_pid:
                    out.append(p)
            except (OSError, psutil.Error):
                pass
        return out

    try:
        api_pid = int(launcher.stdout.readline())
        deadline = time.monotonic() + 60  # the engine core is a child of the API server, in its group
        while len(group()) < 2:
            assert time.monotonic() < deadline, f"no engine core beside the API server: {group()}"
            time.sleep(0.2)
        for pid in (launcher.pid, api_pid):  # the launcher and its direct children, at once
            os.kill(pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 40
        while group() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = [f"{p.pid} {' '.join(p.cmdline())[:40]}" for p in group()]
        assert not left, f"left behind: {left}"
    finally:
        for p in group():
            p.kill()
