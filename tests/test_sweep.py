"""`qwen3lab sweep`: the dry run of the GPU experiments lists every trial with its verdict; pre-flight's
expected rejections; a sweep killed mid-way resumes without duplicate runs and leaves no vLLM behind."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from qwen3lab.measure import engine
from qwen3lab.experiment import preflight
from qwen3lab import sweep
from qwen3lab.measure.loadgen import run_sync
from qwen3lab.experiment import files as xp
from qwen3lab.errors import Qwen3LabError
from qwen3lab.store import Store

ROOT = Path(__file__).resolve().parents[1]
GPU_EXPERIMENTS = ["experiments/a100-80g-qwen3-14b.yaml", "experiments/rtx4090-qwen3-14b.yaml"]


def cli(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="220")
    return subprocess.run([sys.executable, "-m", "qwen3lab.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)


def table_rows(text: str) -> dict[tuple[str, str], str]:
    """(chapter, trial) -> verdict, from the first line of each row of the dry-run table."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) < 6 or not cells[2] or cells[3] not in ("ok", "skip", "error", "rejected"):
            continue
        rows[(cells[1], cells[2])] = cells[3]
    return rows


@pytest.mark.parametrize("path", GPU_EXPERIMENTS)
def test_dry_run_prints_every_trial_with_its_command_and_verdict(path):
    got = cli("sweep", path, "--dry-run")
    assert got.returncode == 0, got.stdout + got.stderr
    exp = xp.load(ROOT / path)
    trials = xp.expand(exp)
    rows = table_rows(got.stdout)
    assert {(t.chapter, t.name) for t in trials} == set(rows), "a trial is missing from the dry run"
    flat = re.sub(r"[│\s]+", " ", got.stdout)
    for t in trials:
        assert t.engine.model in flat
    # The recipes are measured: their trials are there, the invalid lines rejected as expected.
    recipe = [t for t in trials if t.tags.get("recipe")]
    assert recipe and any(rows[(t.chapter, t.name)] == "rejected" for t in recipe)
    assert any(rows[(t.chapter, t.name)] == "ok" for t in recipe)
    assert "vllm serve Qwen/Qwen3-14B" in flat
    assert f"{len(trials)} trials" in got.stdout


def test_a100_recipe_is_printed_verbatim():
    got = cli("sweep", GPU_EXPERIMENTS[0], "--dry-run", "--only", "baseline")
    flat = re.sub(r"[│\s]+", " ", got.stdout)
    for flag in ("--quantization fp8", "--kv-cache-dtype fp8", "--block-size 32", "--max-num-seqs 128",
                 "--enforce-eager", "--gpu-memory-utilization 0.92", "--max-model-len 131072"):
        assert flag in flat
    assert "--model" not in flat  # deprecated: the model is positional


def test_4090_recipe_awq_on_bf16_is_rejected_by_preflight():
    exp = xp.load(ROOT / GPU_EXPERIMENTS[1])
    trial = next(t for t in xp.expand(exp, ["baseline"]) if t.name == "recipe-4090-verbatim")
    v = preflight.check(trial, preflight.Machine.for_gpu("rtx4090"), "rtx4090")
    assert v.label == "rejected" and not v.errors
    assert "AWQ checkpoint" in v.skip
    # Without the expectation tag it is a plain error, which stops a sweep before any launch.
    plain = trial.model_copy(update={"tags": {}})
    assert preflight.check(plain, preflight.Machine.for_gpu("rtx4090"), "rtx4090").errors


def test_dry_run_with_an_unexpected_error_exits_2_and_still_lists_every_trial(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("""
name: bad
gpu: a100-80g
engine: {model: Qwen/Qwen3-14B}
chapters:
  baseline:
    trials:
      - name: fine
      - name: too-long
        engine.max_model_len: 131072
      - name: passes-but-expected-to-fail
        tags: {expect: error}
""")
    got = cli("sweep", str(path), "--dry-run")
    assert got.returncode == 2
    rows = table_rows(got.stdout)
    assert rows == {("baseline", "fine"): "ok", ("baseline", "too-long"): "error",
                    ("baseline", "passes-but-expected-to-fail"): "error"}
    assert "pre-flight error" in got.stdout


def test_skipped_trial_makes_machine_rules_moot():
    t = xp.expand(xp.load(ROOT / "experiments/cpu-tiny.yaml"), ["block_size"])
    block16 = next(x for x in t if x.name == "block-16")
    v = preflight.check(block16, preflight.Machine(device="cpu"), "cpu")
    assert v.label == "skip" and not v.errors and any("multiple of 32" in n for n in v.notes)
    unmarked = block16.model_copy(update={"skip_reason": None})
    assert preflight.check(unmarked, preflight.Machine(device="cpu"), "cpu").errors


def test_plan_orders_chapters_and_places_outputs(tmp_path):
    exp, execs = sweep.plan(ROOT / "experiments/cpu-tiny.yaml", str(tmp_path / "x.duckdb"), None,
                            str(tmp_path / "runs"), {"num_requests": 3}, stamp="S")
    stems = [e.notebook for e in execs]
    assert stems == sorted(stems) and stems[0] == "00_environment" and stems[-1] == "99_report"
    assert len(stems) == len(exp.all_chapters()) + 2  # one notebook per chapter, plus environment and report
    assert "82_routing" in stems
    # a notebook that runs two chapters (traffic reads as 50_prefix_cache) is saved once per chapter
    assert len({e.output_path for e in execs}) == len(execs)
    seen = set()
    for e in execs:
        name = f"{e.notebook}-{e.chapter}.ipynb" if e.notebook in seen else f"{e.notebook}.ipynb"
        seen.add(e.notebook)
        assert e.output_path == tmp_path / "runs" / "cpu-tiny" / "S" / name
        if e.chapter:
            assert e.parameters["notebook_path"] == str(e.output_path)
            assert e.parameters["num_requests"] == 3
    with pytest.raises(Qwen3LabError):
        sweep.plan(ROOT / "experiments/cpu-tiny.yaml", "x.duckdb", ["no-such-chapter"])


def test_parse_params():
    assert sweep.parse_params(["num_requests=4", "retry_failed=true", "x=null", "s=a=b"]) == {
        "num_requests": 4, "retry_failed": True, "x": None, "s": "a=b"}
    with pytest.raises(Qwen3LabError):
        sweep.parse_params(["oops"])


def test_the_summary_counts_each_server_start_once():
    import pandas as pd

    # A capacity search's three load points (one server, one log), two plain runs (a server each), a soak whose
    # server restarted once (one log, two starts), two runs that kept no log, and one stored before starts were.
    rows = pd.DataFrame([
        ("p0", "runs/cap-1/server.log", 30.0, 10.0), ("p1", "runs/cap-1/server.log", 30.0, 12.0),
        ("p2", "runs/cap-1/server.log", 30.0, 14.0), ("r1", "runs/r1/server.log", 20.0, 5.0),
        ("r2", "runs/r2/server.log", 20.0, 6.0), ("w0", "runs/soak-1/server.log", 25.0, 60.0),
        ("w1", "runs/soak-1/server.log", 25.0, 60.0), ("w2", "runs/soak-1/server.log", 27.0, 60.0),
        ("e1", "", 15.0, 4.0), ("e2", None, 15.0, 4.0), ("old", None, None, 3.0),
    ], columns=["run_id", "log_path", "start_s", "duration"])
    servers = [30.0, 20.0, 20.0, 25.0, 27.0, 15.0, 15.0]
    assert sweep.starting_vs_measuring(rows) == (sum(servers), rows.duration.sum())
    assert sweep.starting_vs_measuring(rows[rows.run_id == "old"]) is None
    assert sweep.starting_vs_measuring(rows.iloc[0:0]) is None


def test_run_coroutine_inside_a_running_loop():
    async def inner():
        await asyncio.sleep(0.01)
        return 7

    async def outer():  # like a Jupyter kernel: a loop is already running in this thread
        return run_sync(inner())

    assert asyncio.run(outer()) == 7
    assert run_sync(inner()) == 7


# --- a real sweep, killed mid-way --------------------------------------------------------------------------
MARK = f"qwen3lab-test-sweep-{os.getpid()}"  # in the environment of every process this test starts


def vllm_servers() -> set[int]:
    """vLLM processes started by this test (others' tests may run servers of their own at the same time)."""
    out = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any("vllm" in part for part in (p.info["cmdline"] or [])) and \
                    p.environ().get("QWEN3LAB_TEST_MARK") == MARK:
                out.add(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def wait_for(predicate, timeout: float, what: str, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the sweep ended (rc {proc.returncode}) before {what}")
        time.sleep(1)
    pytest.fail(f"timed out waiting for {what}")


def runs_of(db: Path):
    if not db.exists():
        return None
    try:
        return Store(db).runs(with_json=True)
    except Exception:  # noqa: BLE001 - the sweep's kernel holds the file for a moment
        return None


def test_killed_sweep_resumes_without_duplicates_and_leaves_nothing_behind(tmp_path):
    db, runs_dir, log = tmp_path / "sweep.duckdb", tmp_path / "runs", tmp_path / "sweep.log"
    args = [sys.executable, "-m", "qwen3lab.cli", "sweep", "experiments/cpu-tiny.yaml", "--only", "scheduler",
            "--db", str(db), "--runs-dir", str(runs_dir), "-p", "num_requests=3", "-p", "warmup_requests=0"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), QWEN3LAB_TEST_MARK=MARK)
    with open(log, "w") as out:
        proc = subprocess.Popen(args + ["-p", "max_trials=2"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        def first_ok_second_running():
            df = runs_of(db)
            return df is not None and (df.status == "ok").sum() == 1 and (df.status == "running").sum() == 1

        wait_for(first_ok_second_running, 600, "the second trial to start", proc)
        time.sleep(8)  # its vLLM server is starting up
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 130, text[-3000:]
    wait_for(lambda: not vllm_servers(), 60, "every vLLM server to stop")
    df = runs_of(db)
    assert sorted(df.status) == ["interrupted", "ok"], df[["trial", "status", "reason"]].to_string()
    for argv in df.exec_argv_json.dropna():
        port = int(json.loads(argv)[-1])
        assert engine.port_is_free(port)
    interrupted = df[df.status == "interrupted"].trial_key.iloc[0]
    first = df[df.status == "ok"].trial_key.iloc[0]
    saved = list((runs_dir / "cpu-tiny").glob("*/40_scheduler.ipynb"))
    assert saved, "the interrupted notebook is still saved"

    # Resume: the finished trial is not run again; the interrupted one is, once.
    got = subprocess.run(args + ["-p", "max_trials=1"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    df = runs_of(db)
    done = df[df.status.isin(["ok", "skipped"])]
    assert not done.trial_key.duplicated().any(), done[["trial", "status"]].to_string()
    assert (df.trial_key == first).sum() == 1
    assert set(df[df.trial_key == interrupted].status) == {"interrupted", "ok"}
    assert not vllm_servers()
    # Every run produced by a notebook carries that notebook's path, and the file exists.
    for path in df.notebook_path:
        assert path and Path(path).is_file()
    # Each sweep is a campaign (docs/history.md): the stopped one ended as interrupted, the resumed one ok; the
    # runs its notebook kernels made name it; its executed notebooks are listed, kept in a folder of its own.
    stopped, resumed = Store(db).campaigns().to_dict("records")
    assert (stopped["command"], stopped["status"], resumed["status"]) == ("sweep", "interrupted", "ok")
    assert stopped["ended_at"] and json.loads(stopped["params_json"])["max_trials"] == 2
    by_campaign = df.groupby("campaign_id").status.apply(sorted).to_dict()
    assert by_campaign == {stopped["campaign_id"]: ["interrupted", "ok"], resumed["campaign_id"]: ["ok"]}
    for camp, last in ((stopped, "interrupted"), (resumed, "ok")):
        books = json.loads(camp["notebooks_json"])
        assert [(b["notebook"], b["status"]) for b in books][:2] == [("00_environment", "ok"), ("40_scheduler", last)]
        assert all(Path(b["path"]).is_file() and Path(b["path"]).parent == Path(camp["notebooks_dir"]) for b in books)


def test_yarn_needs_max_position_embeddings_raised_on_vllm_032():
    from qwen3lab.experiment.spec import EngineConfig, Trial, Workload

    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1000000}

    def verdict(overrides):
        cfg = EngineConfig(model="Qwen/Qwen3-14B", max_model_len=131072, hf_overrides=overrides)
        return preflight.check(Trial(experiment="x", name="t", engine=cfg, workload=Workload()))

    assert verdict({"rope_parameters": rope, "max_position_embeddings": 131072}).ok
    bad = verdict({"rope_parameters": rope})
    assert bad.errors and "max_position_embeddings" in str(bad.errors[0])


def test_fp8_kv_on_a_cpu_without_avx512_is_skipped():
    from qwen3lab.experiment.spec import EngineConfig, Trial, Workload

    trial = Trial(experiment="x", name="t", workload=Workload(),
                  engine=EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", kv_cache_dtype="fp8"))
    avx2 = preflight.Machine(device="cpu", cpu_flags=frozenset({"avx2"}))
    assert "AVX-512" in preflight.check(trial, avx2).skip
    assert preflight.check(trial, preflight.Machine(device="cpu", cpu_flags=frozenset({"avx2", "avx512f"}))).ok
    assert preflight.check(trial, preflight.Machine(device="cpu")).ok  # flags unknown: judged where it runs


def test_two_chapters_on_one_notebook_get_one_executed_file_each(tmp_path):
    """The H200 experiment's emulation chapter runs 20_quantization.ipynb, as its quantization chapter does:
    the second execution must not overwrite the first's saved notebook."""
    _, execs = sweep.plan(ROOT / "experiments/h200-qwen3-14b.yaml", str(tmp_path / "x.duckdb"),
                          ["quantization", "emulation"], str(tmp_path / "runs"), stamp="S")
    outs = {e.chapter: e.output_path.name for e in execs if e.chapter}
    assert outs == {"quantization": "20_quantization.ipynb", "emulation": "20_quantization-emulation.ipynb"}
    assert all(e.parameters["notebook_path"] == str(e.output_path) for e in execs if e.chapter)
