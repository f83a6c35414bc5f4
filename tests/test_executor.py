"""The one planner and executor on a real DuckDB file, without a server: an experiment written for a GPU, on a
machine judged without one, stores every trial as skipped with the reason; run again, every trial resumes."""
from __future__ import annotations

from pathlib import Path

import pytest

from qwen3lab.errors import SpecErrors
from qwen3lab.experiment import preflight
from qwen3lab.measure import executor

ROOT = Path(__file__).resolve().parents[1]
A100 = ROOT / "experiments" / "a100-80g-qwen3-14b.yaml"
CPU = preflight.Machine(device="cpu", numa_nodes=1, has_numactl=True)


class Recorder(executor.Listener):
    def __init__(self):
        self.lines: list[str] = []
        super().__init__(self.lines.append)
        self.events: list[tuple[str, str]] = []

    def resumed(self, trial, run_id, status):
        self.events.append(("resumed", trial.name))
        super().resumed(trial, run_id, status)

    def launching(self, trial, verdict):
        self.events.append(("launching", trial.name))

    def finished(self, result):
        self.events.append((result.status, result.trial.name))
        super().finished(result)


def test_a_gpu_experiment_on_a_cpu_is_stored_skipped_then_resumed(store, tmp_path):
    planned = executor.plan(A100, ["baseline"], machine=CPU)
    # Skipped: the machine has no GPU, or (a recipe tagged `expect: error`) pre-flight rejects it, as expected.
    assert planned.trials and all(v.skip and ("no GPU" in v.skip or "rejected" in v.skip) for v in planned.verdicts)
    first = Recorder()
    results = executor.execute(planned, store, tmp_path / "runs", listener=first)
    assert [r.status for r in results] == ["skipped"] * len(planned.trials)
    assert [e for e in first.events if e[0] == "resumed"] == []
    runs = store.runs(experiment=planned.experiment.name)
    assert len(runs) == len(planned.trials) and set(runs.reason) == {v.skip for v in planned.verdicts}
    assert runs.launch_command.str.contains("--model ").all()  # the pasteable form, not `vllm serve builtin:`

    again = Recorder()
    results = executor.execute(executor.plan(A100, ["baseline"], machine=CPU), store, tmp_path / "runs",
                               listener=again)
    assert again.events == [("resumed", t.name) for t in planned.trials]
    assert all("earlier" in line and "not run again" in line for line in again.lines)
    assert len(store.runs(experiment=planned.experiment.name)) == len(planned.trials)  # nothing stored twice


def test_plan_for_the_written_gpu_judges_there(store):
    planned = executor.plan(A100, ["baseline"], for_written_gpu=True)
    assert planned.machine.gpu_name and planned.machine.compute_capability == (8, 0)
    assert not any(v.skip and "no GPU" in v.skip for v in planned.verdicts)


def test_execute_refuses_a_plan_with_errors_before_storing_anything(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nengine: {model: builtin:qwen3-14b, max_model_len: 131072}\n"
                   "trials: [{name: a}]\n")
    planned = executor.plan(bad, machine=CPU)
    assert planned.errors
    from qwen3lab.store import Store

    with pytest.raises(SpecErrors, match="max_model_len"):
        executor.execute(planned, Store(tmp_path / "never.duckdb"))
    assert not (tmp_path / "never.duckdb").exists()
