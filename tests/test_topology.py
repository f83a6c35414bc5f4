"""The split topology end to end on real vLLM servers: two tiny servers and the router started by the runner,
every request stored with the route that served it, and nothing left running, also when a server fails."""
from __future__ import annotations

import time

import psutil

from qwen3lab.experiment.spec import RequestClass, Trial
from qwen3lab.measure import runner

from .conftest import small_workload, tiny_config, vllm_processes

THRESHOLD = 100


def split_trial(name: str, **long_overrides) -> Trial:
    engine = tiny_config(topology={"kind": "split", "threshold_tokens": THRESHOLD,
                                   "routes": {"short": {"max_model_len": 1024, "max_num_seqs": 8},
                                              "long": long_overrides}})
    mix = [RequestClass(name="chat", prompt_tokens=(16, 64), output_tokens=8),
           RequestClass(name="document", prompt_tokens=(300, 600), output_tokens=8)]
    return Trial(experiment="split", name=name, engine=engine, workload=small_workload(mix=mix, num_requests=16,
                                                                                       concurrency=4))


def ours_left() -> list:
    """vLLM servers and routers started by this test process."""
    me = psutil.Process()
    left = vllm_processes()
    for p in me.children(recursive=True):
        try:
            if "router" in p.cmdline() and p not in left:
                left.append(p)
        except psutil.Error:
            pass
    return left


def wait_gone(timeout: float = 20) -> list:
    deadline = time.monotonic() + timeout
    while (left := ours_left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_split_trial_stores_each_requests_route(store, tmp_path):
    result = runner.run_trial(split_trial("two-servers"), store, runs_dir=tmp_path, log=lambda _: None)
    assert result.status == "ok", result.reason
    rows = store.requests([result.run_id])
    assert len(rows) == 16 and rows.error.isna().all()
    assert set(rows.route) == {"short", "long"}
    for r in rows.itertuples():  # the router's count is the server's own, so the route follows prompt_tokens
        assert r.route == ("short" if r.prompt_tokens <= THRESHOLD else "long"), r
        assert r.route == ("short" if r.request_class == "chat" else "long")
    run = store.run(result.run_id)
    assert "qwen3lab router" in run["launch_command"] or " router " in run["launch_command"]
    assert run["launch_command"].count("--port") >= 3  # short, long and the router
    assert (tmp_path / result.run_id / "server-long.log").exists() and (tmp_path / result.run_id / "router.log").exists()
    assert wait_gone() == []


def test_a_server_that_fails_to_start_takes_the_others_down(store, tmp_path):
    # A flag pre-flight does not know, so it passes there and vLLM refuses it at start: short is up by then.
    result = runner.run_trial(split_trial("long-fails", extra_args=["--no-such-flag-qwen3lab"]), store,
                              runs_dir=tmp_path, log=lambda _: None)
    assert result.status == "failed" and "no-such-flag-qwen3lab" in result.reason, result.reason
    assert "Application startup complete" in (tmp_path / result.run_id / "server.log").read_text()  # short was up
    assert wait_gone() == []
