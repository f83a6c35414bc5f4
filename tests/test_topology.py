"""The split topology end to end on real vLLM servers: two tiny servers and the router started by the runner,
every request stored with the route that served it, and nothing left running, also when a server fails."""
from __future__ import annotations

import math
import time

import psutil
import pytest
import yaml

from qwen3lab.analysis import export
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import EngineConfig, RequestClass, Trial, Workload
from qwen3lab.errors import SpecError
from qwen3lab.measure import runner, topology

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
    assert run["attention_backend"] == "CPU_ATTN"  # both routes' servers logged it: one value
    assert "qwen3lab router" in run["launch_command"] or " router " in run["launch_command"]
    assert run["launch_command"].count("--port") >= 3  # short, long and the router
    assert (tmp_path / result.run_id / "server-long.log").exists() and (tmp_path / result.run_id / "router.log").exists()
    exported = export.export_run(run, model="Qwen/Qwen3-0.6B")  # a split run exports as its three processes
    assert exported.shell.count("serve Qwen/Qwen3-0.6B") == 2 and len(yaml.safe_load(exported.compose)["services"]) == 3
    assert result.summary["router_added_ttft_pairs"] >= 1  # the router's own cost, from paired requests
    assert math.isfinite(result.summary["router_added_ttft_mean_ms"])
    assert wait_gone() == []


def test_a_server_that_fails_to_start_takes_the_others_down(store, tmp_path):
    # A flag pre-flight does not know, so it passes there and vLLM refuses it at start: short is up by then.
    result = runner.run_trial(split_trial("long-fails", extra_args=["--no-such-flag-qwen3lab"]), store,
                              runs_dir=tmp_path, log=lambda _: None)
    assert result.status == "failed" and "no-such-flag-qwen3lab" in result.reason, result.reason
    assert "Application startup complete" in (tmp_path / result.run_id / "server.log").read_text()  # short was up
    assert wait_gone() == []


YARN = {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                            "rope_theta": 1000000}, "max_position_embeddings": 131072}


def recipe_split(model: str, split, **base) -> Trial:
    engine = EngineConfig(model=model, **base, topology={
        "kind": "split", "threshold_tokens": 2048, "memory_split": split,
        "routes": {"short": {"max_model_len": 8192}, "long": {"max_model_len": 131072, "hf_overrides": YARN}}})
    return Trial(experiment="a100", name="split", engine=engine, workload=Workload(mix="recipe-mix"))


def test_preflight_plans_each_server_at_its_share():
    # The recipe's two BF16 servers at 0.45 of an A100 80GB: the long one holds less than one 131072-token sequence.
    bf16 = preflight.check(recipe_split("Qwen/Qwen3-14B", [0.45, 0.45]), None, "a100-80g")
    [error] = bf16.errors
    assert "split/long" in str(error) and "131,072" in str(error)
    fp8 = preflight.check(recipe_split("Qwen/Qwen3-14B-FP8", [0.3, 0.6], kv_cache_dtype="fp8"), None, "a100-80g")
    assert fp8.errors == [] and set(fp8.plan["routes"]) == {"short", "long"}
    assert fp8.plan["routes"]["long"]["kv_capacity_tokens"] > fp8.plan["routes"]["short"]["kv_capacity_tokens"]


def test_preflight_wants_a_threshold_both_servers_hold():
    trial = split_trial("tight")
    tight = trial.model_copy(update={"engine": tiny_config(topology={
        "kind": "split", "threshold_tokens": 1020, "routes": {"short": {"max_model_len": 1024}, "long": {}}})})
    [error] = preflight.check(tight, None, "cpu").errors
    assert error.field == "engine.topology.routes.short.max_model_len" and "1020 + 8 = 1028" in str(error)


@pytest.mark.parametrize("topology, says", [
    ({"kind": "split", "threshold_tokens": 10, "memory_split": [0.6, 0.6]}, "at most 1"),
    ({"kind": "split", "threshold_tokens": 10, "routes": {"short": {}}}, "exactly short and long"),
    ({"kind": "split", "threshold_tokens": 10, "routes": {"short": {"model": "x"}, "long": {}}}, "may not set model"),
    ({"kind": "split", "threshold_tokens": 10, "routes": {"short": {}, "long": {"max_num_seqs": 0}}},
     "topology.routes.long.max_num_seqs"),
])
def test_bad_topologies_are_refused_naming_the_field(topology, says):
    with pytest.raises(ValueError, match=says):
        tiny_config(topology=topology)


def test_route_gpus_are_the_gpus_ray_assigned_to_the_task():
    # Run here: topology.gpus as written. In a Ray task: the distinct indices, lowest first, onto the ids Ray
    # gave that task (ray.get_gpu_ids()), never the node's GPU 0 that another task may hold.
    assert topology.route_devices((0, 1)) == ("0", "1")
    assert topology.route_devices((0, 1), ["3", "5"]) == ("3", "5")
    assert topology.route_devices((1, 0), ["3", "5"]) == ("5", "3")
    assert topology.route_devices((0, 2), ["4", "7"]) == ("4", "7")  # two servers, two GPUs reserved
    assert topology.route_devices((1, 1), ["6"]) == ("6", "6")  # both on one GPU: one reserved
    with pytest.raises(SpecError) as caught:
        topology.route_devices((0, 1), ["3"])
    assert caught.value.field == "engine.topology.gpus" and caught.value.value == [0, 1]
    assert "at most 1 distinct" in caught.value.allowed and "3" in caught.value.allowed
    # Each route's server gets its own in CUDA_VISIBLE_DEVICES; the stored, pasteable script keeps the written ones.
    cfg = tiny_config(topology={"kind": "split", "threshold_tokens": THRESHOLD, "gpus": [0, 1]})
    env = {name: c.env["CUDA_VISIBLE_DEVICES"] for name, c in topology.route_engines(cfg, ["3", "5"]).items()}
    assert env == {"short": "3", "long": "5"}
    assert {c.env["CUDA_VISIBLE_DEVICES"] for c in topology.route_engines(cfg).values()} == {"0", "1"}
