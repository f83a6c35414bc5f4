"""Shared fixtures: one real vLLM server (the embedded default engine) per test session, and temp stores."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from qwen3lab.experiment.spec import EngineConfig, Workload

REPO = Path(__file__).resolve().parents[1]
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
