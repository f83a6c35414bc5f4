"""What lets the GPU experiments run on an offline GPU host, checked without one: dummy-weight 14B folders with
a tokenizer made here, memory emulation of a smaller card, and the steady-state TTFT beside the whole run's."""
from __future__ import annotations

import json

import numpy as np
import pytest

from qwen3lab import models
from qwen3lab.analysis import metrics
from qwen3lab.errors import SpecError
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import SLO, EngineConfig, Trial, Workload
from qwen3lab.hardware import memory
from qwen3lab.hardware.catalogue import GiB, get_gpu
from qwen3lab.measure import engine, workload

BUILD = engine.Build("python3", "0.26.0", "vllm", "2.11.0")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    import os

    old = os.environ.get("QWEN3LAB_CACHE")
    os.environ["QWEN3LAB_CACHE"] = str(tmp_path_factory.mktemp("q3cache"))
    yield os.environ["QWEN3LAB_CACHE"]
    if old is None:
        del os.environ["QWEN3LAB_CACHE"]
    else:
        os.environ["QWEN3LAB_CACHE"] = old


@pytest.mark.parametrize("model", ["builtin:qwen3-14b", "Qwen/Qwen3-14B-FP8", "builtin:qwen3-14b-awq"])
def test_dummy_14b_models_get_a_local_full_size_tokenizer(model, cache):
    cfg = EngineConfig(model=model, load_format="dummy")
    argv = engine.exec_argv(cfg, 8000, BUILD)
    folder = argv[4]
    assert folder.startswith(cache) and "--tokenizer" not in argv  # the folder holds its own: no hub
    assert engine.server_env_defaults(cfg) == {"HF_HUB_OFFLINE": "1"}
    assert workload.tokenizer_source(cfg) == folder
    tok = json.load(open(f"{folder}/tokenizer.json"))
    ids = sorted([*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])])
    assert ids == list(range(151936))  # every id the model can sample decodes
    specials = {t["id"]: t["content"] for t in tok["added_tokens"]}
    assert specials[151645] == "<|im_end|>" and specials[151667] == "<think>"
    assert json.load(open(f"{folder}/config.json")) == json.load(open(models.find_config(model)))
    # Prompts of exact lengths come from the same tokenizer the server uses.
    prompt_tok = workload.load_tokenizer(folder)
    assert prompt_tok.count("hello world") > 0


def test_real_weights_still_ask_for_the_hub_tokenizer(cache):
    argv = engine.exec_argv(EngineConfig(model="builtin:qwen3-14b"), 8000, BUILD)
    assert argv[argv.index("--tokenizer") + 1] == "Qwen/Qwen3-14B"


def test_emulated_utilization_gives_vllm_the_target_budget():
    h200 = get_gpu("h200").memory_total_bytes
    util = memory.emulated_utilization("rtx4090", None, h200)
    assert util * h200 == pytest.approx(get_gpu("rtx4090").memory_total_bytes * 0.92, rel=1e-5)
    assert util * h200 <= get_gpu("rtx4090").memory_total_bytes * 0.92  # never above it
    with pytest.raises(SpecError, match="engine.emulate"):
        memory.emulated_utilization("h200", None, get_gpu("rtx4090").memory_total_bytes)
    with pytest.raises(ValueError, match="unknown GPU 'v100' to emulate"):
        EngineConfig(emulate="v100")


def test_an_emulated_launch_caps_memory_and_pins_the_targets_batch_defaults():
    cfg = EngineConfig(model="builtin:qwen3-14b-awq", load_format="dummy", emulate="4090")
    assert cfg.emulate == "rtx4090"
    emu = engine.emulation(cfg, host_total_bytes=get_gpu("h200").memory_total_bytes)
    argv = engine.exec_argv(cfg, 8000, BUILD, emulated=emu)
    got = dict(zip(argv, argv[1:]))
    assert float(got["--gpu-memory-utilization"]) == emu["gpu_memory_utilization"] < 0.2
    assert (got["--max-num-seqs"], got["--max-num-batched-tokens"]) == ("256", "2048")  # a 4090's, not an H200's
    assert "--gpu-memory-utilization" not in cfg.to_shell()  # the exported command is the target card's own


def test_preflight_judges_an_emulated_trial_on_the_target_card():
    def verdict(**engine_fields):
        trial = Trial(experiment="t", name="x", workload=Workload(),
                      engine=EngineConfig(load_format="dummy", **engine_fields))
        return preflight.check(trial, preflight.Machine.for_gpu("h200"), "h200")

    (err,) = verdict(model="builtin:qwen3-14b", emulate="rtx4090").errors
    assert "BF16 weights 27.5 GiB > 23.6 GiB x 0.92" in err.fix
    awq = verdict(model="builtin:qwen3-14b-awq", emulate="rtx4090", max_model_len=32768)
    assert awq.errors == [] and awq.plan["device"] == "rtx4090" and awq.plan["emulated"]["gpu"] == "rtx4090"
    assert awq.plan["summary"].startswith("emulating NVIDIA GeForce RTX 4090")
    fp8 = verdict(model="builtin:qwen3-14b-awq", emulate="rtx4090", max_model_len=32768, kv_cache_dtype="fp8")
    assert fp8.plan["kv_capacity_tokens"] == pytest.approx(2 * awq.plan["kv_capacity_tokens"], rel=0.001)
    assert awq.plan["memory"]["kv_bytes"] < 15 * GiB < verdict(model="builtin:qwen3-14b").plan["memory"]["kv_bytes"]


def _table(ttft_s: list[float], sent_at: list[float]) -> metrics.RequestTable:
    n = len(ttft_s)
    return metrics.RequestTable.from_columns(
        ok=[True] * n, ttft=ttft_s, e2el=[t + 1.0 for t in ttft_s], prompt_tokens=[100] * n, output_tokens=[10] * n,
        chunk_times=[[t + 0.1 * i for i in range(10)] for t in ttft_s], request_class=["c"] * n, sent_at=sent_at)


def test_steady_state_ttft_leaves_the_opening_burst_out_and_both_are_kept():
    # 8 requests sent at once on an idle server queue their prefills (0.4-0.5 s); the next 92 see ~50 ms.
    rng = np.random.default_rng(0)
    burst = list(0.4 + 0.1 * rng.random(8))
    steady = list(0.04 + 0.02 * rng.random(92))
    sent = [0.0] * 8 + list(np.linspace(0.5, 10, 92))
    order = rng.permutation(100)  # stored order need not be send order
    table = _table([(burst + steady)[i] for i in order], [sent[i] for i in order])
    slo = SLO(ttft_p95_ms=200)
    s = metrics.summarize(table, 10.0, slo, opening_burst=8)
    assert s["p95_ttft_ms"] > 400 and s["slo_pass"] is False  # the whole run: judged by the burst
    assert s["steady_p95_ttft_ms"] < 60 and s["steady_slo_pass"] is True
    assert s["opening_burst_requests"] == 8 and s["completed"] == 100  # nothing dropped from the run itself
    assert "steady_p95_ttft_ms" not in metrics.summarize(table, 10.0, slo)  # an open loop has no burst
