"""Specs: canonical argv round-trips, and bad input is refused with field, value, allowed and fix."""
from __future__ import annotations

import shlex
from pathlib import Path
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwen3lab.experiment import files as xp
from qwen3lab.experiment import preflight
from qwen3lab.errors import SpecError, SpecErrors
from qwen3lab.experiment.spec import ATTENTION_BACKENDS, KV_CACHE_DTYPES, EngineConfig, Trial, Workload

flag_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=20)
configs = st.builds(
    EngineConfig,
    model=st.sampled_from(["builtin:qwen3-tiny", "Qwen/Qwen3-14B", "/models/my model", "./m;$x"]),
    served_model_name=st.none() | flag_text.filter(lambda s: not s.startswith("-")),
    quantization=st.none() | st.sampled_from(["fp8", "awq_marlin", "gptq"]),
    kv_cache_dtype=st.none() | st.sampled_from(KV_CACHE_DTYPES),
    block_size=st.none() | st.integers(1, 16).map(lambda k: 16 * k),
    max_model_len=st.none() | st.integers(1, 2**20),
    max_num_seqs=st.none() | st.integers(1, 4096),
    max_num_batched_tokens=st.none() | st.integers(1, 2**20),
    gpu_memory_utilization=st.none() | st.floats(0.01, 1.0),
    enforce_eager=st.none() | st.booleans(),
    enable_prefix_caching=st.none() | st.booleans(),
    attention_backend=st.none() | st.sampled_from(ATTENTION_BACKENDS),
    tensor_parallel_size=st.none() | st.integers(1, 8),
    load_format=st.none() | st.sampled_from(["dummy", "safetensors"]),
    hf_overrides=st.none() | st.fixed_dictionaries({"rope_parameters": st.fixed_dictionaries({
        "rope_type": st.just("yarn"), "factor": st.floats(1.0, 8.0), "original_max_position_embeddings": st.just(32768)})}),
    seed=st.none() | st.integers(0, 2**31),
    numa_bind=st.none() | st.booleans(),
    numa_bind_nodes=st.none() | st.lists(st.integers(0, 7), min_size=1, max_size=4),
    numa_node=st.none() | st.integers(0, 7),
    python=st.none() | st.sampled_from(["/opt/vllm-0.33/bin/python", "/opt/venv b/bin/python", "/opt/src build"]),
    extra_args=st.sampled_from([[], ["--swap-space", "4"], ["--disable-log-requests"], ["--api-key", "a b;$c"]]),
)


@settings(max_examples=300, deadline=None)
@given(configs)
def test_argv_round_trips(cfg):
    argv = cfg.to_argv()
    assert argv[argv.index("serve") - 1].endswith("vllm")
    assert argv[argv.index("serve") + 1] == cfg.model  # model positional, right after serve
    assert "--model" not in argv
    assert EngineConfig.from_argv(argv, env=cfg.env) == cfg
    # The shell form parses back to the same argv, whatever quoting the values need.
    assert shlex.split(cfg.to_shell()) == argv


def test_flags_are_vllms_names():
    cfg = EngineConfig(model="Qwen/Qwen3-14B-FP8", quantization="fp8", kv_cache_dtype="fp8", block_size=32,
                       max_num_seqs=128, max_model_len=131072, gpu_memory_utilization=0.92, enforce_eager=True,
                       enable_prefix_caching=False, numa_node=0)
    assert cfg.to_argv() == [
        "numactl", "--cpunodebind=0", "--membind=0", "vllm", "serve", "Qwen/Qwen3-14B-FP8",
        "--quantization", "fp8", "--kv-cache-dtype", "fp8", "--block-size", "32", "--max-model-len", "131072",
        "--max-num-seqs", "128", "--gpu-memory-utilization", "0.92", "--enforce-eager", "--no-enable-prefix-caching"]


def test_nothing_set_means_vllm_defaults():
    assert EngineConfig(model="Qwen/Qwen3-14B").to_argv() == ["vllm", "serve", "Qwen/Qwen3-14B"]


def test_venv_folder_means_its_python():
    cfg = EngineConfig(python="/opt/vllm-src")
    assert cfg.python == "/opt/vllm-src/bin/python"
    assert cfg.to_argv()[0] == "/opt/vllm-src/bin/vllm"


@pytest.mark.parametrize("field,value,needle", [
    ("block_size", 24, "multiple of 16"),
    ("gpu_memory_utilization", 1.5, "(0, 1]"),
    ("max_num_seqs", 0, "positive"),
    ("quantization", "int3", "allowed"),
])
def test_field_rules(field, value, needle):
    with pytest.raises(Exception) as info:
        EngineConfig(**{field: value})
    assert needle in str(info.value)


def _write(tmp_path, body: str):
    p = tmp_path / "exp.yaml"
    p.write_text(textwrap.dedent(body))
    return p


def _errors(tmp_path, body: str) -> list[SpecError]:
    with pytest.raises(SpecErrors) as info:
        xp.expand(xp.load(_write(tmp_path, body)))
    return info.value.errors


def test_unknown_key_names_field_value_allowed_and_fix(tmp_path):
    (e,) = _errors(tmp_path, """
        name: t
        engine: {model: builtin:qwen3-tiny, max_num_seq: 8}
        trials: [{name: a}]
    """)
    assert e.field == "engine.max_num_seq" and e.value == 8
    assert "max_num_seqs" in e.fix and "max_num_seqs" in e.allowed
    assert "trial 'a'" in str(e)


def test_wrong_type_and_out_of_range(tmp_path):
    errors = _errors(tmp_path, """
        name: t
        engine: {model: builtin:qwen3-tiny}
        trials:
          - {name: a, engine.max_num_seqs: lots}
          - {name: b, workload.concurrency: 0}
          - {name: c, engine.kv_cache_dtype: fp4}
    """)
    by_field = {e.field: e for e in errors}
    assert by_field["engine.max_num_seqs"].value == "lots" and "whole number" in by_field["engine.max_num_seqs"].fix
    assert by_field["workload.concurrency"].value == 0
    assert "fp8" in by_field["engine.kv_cache_dtype"].allowed


def test_block_size_not_multiple_of_16(tmp_path):
    (e,) = _errors(tmp_path, """
        name: t
        trials: [{name: a, engine.block_size: 24}]
    """)
    assert e.field == "engine.block_size" and e.value == 24 and "multiple of 16" in e.allowed


def _verdict(**engine):
    trial = Trial(experiment="t", name="x", engine=EngineConfig(**engine), workload=Workload())
    return preflight.check(trial)


def test_max_model_len_above_native_needs_yarn():
    (e,) = _verdict(model="builtin:qwen3-14b", max_model_len=131072).errors
    assert e.field == "engine.max_model_len" and e.value == 131072
    assert "40960" in e.allowed and "yarn" in e.fix
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1000000}
    # vLLM 0.32 takes a YaRN model's max_position_embeddings as already scaled: it must be raised too.
    (e,) = _verdict(model="builtin:qwen3-14b", max_model_len=131072, hf_overrides={"rope_parameters": rope}).errors
    assert "max_position_embeddings" in e.fix
    yarn = {"rope_parameters": rope, "max_position_embeddings": 131072}
    assert _verdict(model="builtin:qwen3-14b", max_model_len=131072, hf_overrides=yarn).errors == []
    (e,) = _verdict(model="builtin:qwen3-14b", max_model_len=262144, hf_overrides=yarn).errors
    assert "131072" in e.allowed


def test_awq_on_a_non_awq_checkpoint():
    (e,) = _verdict(model="Qwen/Qwen3-14B", quantization="awq").errors
    assert e.field == "engine.quantization" and e.value == "awq"
    assert "AWQ checkpoint" in e.allowed and "Qwen3-14B-AWQ" in e.fix
    assert _verdict(model="Qwen/Qwen3-14B-AWQ", quantization="awq_marlin").errors == []


def test_cpu_machine_skips_what_needs_a_gpu():
    cpu = preflight.Machine(device="cpu", has_numactl=True)
    t = lambda **e: Trial(experiment="t", name="x", engine=EngineConfig(**e), workload=Workload())  # noqa: E731
    assert "GPU" in preflight.check(t(model="builtin:qwen3-14b-awq"), cpu).skip
    assert "CPU_ATTN" in preflight.check(t(attention_backend="FLASHINFER"), cpu).skip
    (e,) = preflight.check(t(block_size=16), cpu).errors
    assert "multiple of 32" in e.allowed


def test_fp8_kv_with_flash_attn_on_ampere_is_an_error():
    a100 = preflight.Machine.for_gpu("a100-80g")
    trial = Trial(experiment="t", name="x", workload=Workload(),
                  engine=EngineConfig(model="Qwen/Qwen3-14B", kv_cache_dtype="fp8", attention_backend="FLASH_ATTN"))
    (e,) = preflight.check(trial, a100).errors
    assert e.field == "engine.attention_backend" and "FLASHINFER" in e.fix


def test_matrix_expands_with_names_and_baseline(tmp_path):
    exp = xp.load(_write(tmp_path, """
        name: t
        chapters:
          sched:
            matrix: {engine.max_num_seqs: [4, 8], engine.enforce_eager: [true, false]}
    """))
    trials = xp.expand(exp)
    assert [t.name for t in trials] == ["max_num_seqs=4,enforce_eager=true", "max_num_seqs=4,enforce_eager=false",
                                        "max_num_seqs=8,enforce_eager=true", "max_num_seqs=8,enforce_eager=false"]
    assert trials[0].baseline is None and all(t.baseline == trials[0].name for t in trials[1:])
    assert len({t.key for t in trials}) == 4


def test_extra_args_cannot_shadow_fields():
    with pytest.raises(Exception, match="own field"):
        EngineConfig(extra_args=["--block-size", "32"])
    with pytest.raises(Exception, match="set by qwen3lab"):
        EngineConfig(extra_args=["--port", "9000"])


def test_trials_stored_by_an_older_qwen3lab_keep_their_keys():
    """The committed H200 runs were stored before engine.topology, workload.capacity and stall_timeout_s
    existed: the shipped experiment's trials must still hash to the keys those runs carry, or resume would
    launch every one of them again."""
    import duckdb

    root = Path(__file__).resolve().parents[1]
    keys = {(t.chapter, t.name): t.key for t in xp.expand(xp.load(root / "experiments/h200-qwen3-14b.yaml"))}
    con = duckdb.connect(str(root / "experiments/results/h200-qwen3-14b.duckdb"), read_only=True)
    stored = con.execute("SELECT chapter, trial, trial_key FROM runs WHERE git_commit LIKE 'archive:d62e265%'").fetchall()
    con.close()
    assert len(stored) >= 8
    assert [(ch, tr, keys.get((ch, tr))) for ch, tr, _ in stored] == stored
    # A later field set away from its default is part of the key again.
    t = next(t for t in xp.expand(xp.load(root / "experiments/h200-qwen3-14b.yaml")) if t.name == "bf16-kv-auto")
    assert t.model_copy(update={"workload": t.workload.model_copy(update={"stall_timeout_s": 30.0})}).key != t.key
