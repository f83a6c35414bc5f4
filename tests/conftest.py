"""Shared fixtures: one real vLLM server (the embedded default engine) per test session, and temp stores."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from qwen3lab.experiment.spec import EngineConfig, Workload

REPO = Path(__file__).resolve().parents[1]

# `make test` runs the suite in two pytest-xdist workers, a test file each at a time (--dist loadfile keeps a
# file's module fixtures, and its servers, in one worker). A vLLM CPU server's start is three processes importing
# torch one after the other, one core busy at a time: with the servers of one process on core 1 (cpu_server_pin)
# and everything else waiting, one stream left the other core idle for half the suite. So each worker holds one
# core of its own: its client, its servers (unpinned on one core) and its notebooks' kernels.
# The files that take longest go first, so that neither worker is left with a long one at the end.
SLOWEST_FIRST = ["test_notebooks.py", "test_capacity.py", "test_ray_executor.py", "test_sweep.py", "test_faults.py",
                 "test_soak.py", "test_search.py", "test_router.py", "test_topology.py", "test_fidelity.py",
                 "test_engine.py", "test_cli.py", "test_loadgen.py", "test_dashboard_browser.py"]


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if worker:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(worker.removeprefix("gw")) % len(cpus)]})


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept
# The tiny model on vLLM's CPU backend, eager so it starts fast; 1 GiB of KV cache is ample for it.
TINY = dict(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=2048, enforce_eager=True,
            env={"VLLM_CPU_KVCACHE_SPACE": "1"})


def tiny_config(**overrides) -> EngineConfig:
    return EngineConfig(**{**TINY, **overrides})


def small_workload(**overrides) -> Workload:
    base = dict(num_requests=24, mix="fixed-128", concurrency=8, seed=0)
    return Workload(**{**base, **overrides})


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    """A real `vllm serve` of the tiny Qwen3 on the CPU, shared by the tests that only need a server."""
    from qwen3lab.measure import engine

    log = tmp_path_factory.mktemp("server") / "server.log"
    before = {p.pid for p in vllm_processes()}
    with engine.launch(tiny_config(), log, ready_timeout_s=600) as server:
        SHARED_SERVER_PIDS.update(p.pid for p in vllm_processes() if p.pid not in before)
        try:
            yield server
        finally:
            SHARED_SERVER_PIDS.clear()


@pytest.fixture
def store(tmp_path):
    from qwen3lab.store import Store

    return Store(tmp_path / "test.duckdb")


def spooled_requests(runs_dir) -> int:
    """Requests the runs under runs_dir have finished so far: the spool has them at once, DuckDB after the load."""
    from qwen3lab.spool import Spool

    return sum(len(Spool(p).read().requests) for p in Path(runs_dir).glob("*/spool.jsonl"))


SHARED_SERVER_PIDS: set[int] = set()  # the session's tiny_server: it outlives every test, by design


def vllm_processes() -> list:
    """vLLM server processes started by this test process (children, at any depth), but the shared tiny_server."""
    import psutil

    me = psutil.Process(os.getpid())
    out = []
    for p in me.children(recursive=True):
        try:
            if "vllm" in " ".join(p.cmdline()) and p.pid not in SHARED_SERVER_PIDS:
                out.append(p)
        except psutil.Error:
            pass
    return out
