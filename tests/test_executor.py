"""The one planner and executor on a real DuckDB file, without a server: an experiment written for a GPU, on a
machine judged without one, stores every trial as skipped with the reason; run again, every trial resumes."""
from __future__ import annotations

from pathlib import Path

import pytest

from qwen3lab.errors import SpecErrors
from qwen3lab.experiment import preflight
from qwen3lab.measure import events, executor
from qwen3lab.measure.runner import TrialResult
from qwen3lab.measure.schedule import Schedule

ROOT = Path(__file__).resolve().parents[1]
A100 = ROOT / "experiments" / "a100-80g-qwen3-14b.yaml"
CPU = preflight.Machine(device="cpu", numa_nodes=1, has_numactl=True)


class Recorder(events.Listener):
    def __init__(self):
        self.lines: list[str] = []
        super().__init__(self.lines.append)
        self.events: list[tuple[str, str]] = []

    def resumed(self, trial, text):
        self.events.append(("resumed", trial.name))
        super().resumed(trial, text)

    def launching(self, trial, text, total=None):
        self.events.append(("launching", trial.name))

    def finished(self, trial, status, text):
        self.events.append((status, trial.name))
        super().finished(trial, status, text)


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


# --- the scheduler: which (trial, round) starts next, for the local and the Ray executor ---------------------
TWO_BY_TWO = """
name: sched
gpu: cpu
engine: {model: builtin:qwen3-tiny, load_format: dummy, max_model_len: 1024}
workload: {num_requests: 4, mix: fixed-128, concurrency: 1}
repeats: auto
max_repeats: 3
chapters:
  one:
    trials: [{name: a, engine.max_num_seqs: 8}, {name: b, engine.max_num_seqs: 4}]
"""


def _planned(tmp_path, text=TWO_BY_TWO):
    (tmp_path / "sched.yaml").write_text(text)
    return executor.plan(tmp_path / "sched.yaml", machine=CPU)


def _ok(store, launch) -> TrialResult:
    """A launch's run as an executor stores it: a real row, finished ok."""
    t = launch.trial
    run_id = store.begin_run(trial_key=t.key, experiment=t.experiment, chapter=t.chapter, trial=t.name)
    store.finish_run(run_id, "ok")
    return TrialResult(t, run_id, "ok")


TWO_CAPACITIES = """
name: sched-cap
gpu: cpu
engine: {model: builtin:qwen3-tiny, load_format: dummy, max_model_len: 1024}
workload: {num_requests: 4, mix: fixed-128, capacity: {launches: 2}}
chapters:
  one:
    trials: [{name: a, engine.max_num_seqs: 8}, {name: b, engine.max_num_seqs: 4}]
"""


def _searched(store, launch, capacity=4.0) -> TrialResult:
    """A capacity launch as run_capacities stores it: a search row, finished ok."""
    t = launch.trial
    sid = store.begin_capacity(trial_key=t.key, experiment=t.experiment, chapter=t.chapter, trial=t.name,
                               axis="request_rate")
    store.finish_capacity(sid, "ok", capacity=capacity, low=capacity, high=capacity * 2)
    return TrialResult(t, sid, "ok")


def test_capacity_launches_are_scheduled_as_runs_are_interleaved_and_resumed(store, tmp_path):
    from qwen3lab.measure import capacity as cap

    planned = _planned(tmp_path, TWO_CAPACITIES)
    sched = Schedule(planned, store, lambda *_: None, kind=cap.SEARCHES)
    order = []
    while (launch := sched.next()) is not None:
        order.append((launch.trial.name, launch.label))
        sched.finished(launch, _searched(store, launch, 4.0 if launch.round == 0 else 6.0))
    assert order == [("a", " #1/2"), ("b", " #1/2"), ("a", " #2/2"), ("b", " #2/2")]
    a = cap.stored_capacity(store, planned.trials[0])
    assert (a.capacity, a.low, a.high, len(a.launches)) == (5.0, 4.0, 12.0, 2)
    # resumed: both stand on their two searches; raising launches to 3 asks for one more of each, at round 3
    told = Recorder()
    again = Schedule(planned, store, lambda *_: None, listener=told, kind=cap.SEARCHES)
    assert again.next() is None and [r.trial.name for r in again.results] == ["a", "b"]
    assert any("capacity search" in line and "not run again" in line for line in told.lines)
    three = _planned(tmp_path, TWO_CAPACITIES.replace("launches: 2", "launches: 3"))
    sched = Schedule(three, store, lambda *_: None, kind=cap.SEARCHES)
    assert [(x.trial.name, x.label) for x in iter(sched.next, None)] == [("a", " #3/3"), ("b", " #3/3")]


def test_the_schedule_interleaves_rounds_resumes_and_keeps_max_trials(store, tmp_path):
    planned = _planned(tmp_path)
    assert all(v.ok for v in planned.verdicts)
    never = lambda store, trials: None  # noqa: E731 - repeats: auto's verdict stands after the planned two
    sched = Schedule(planned, store, never)
    order = []
    while (launch := sched.next()) is not None:
        order.append((launch.trial.name, launch.round, launch.label))
        sched.finished(launch, _ok(store, launch))
    assert order == [("a", 0, " #1/2"), ("b", 0, " #1/2"), ("a", 1, " #2/2"), ("b", 1, " #2/2")]

    # resumed: a has both launches, b one more (its second run row goes): b alone, at its next round
    b_runs = store.trial_runs(planned.trials[1].key)
    store.finish_run(str(b_runs.run_id.iloc[0]), "interrupted")
    told = Recorder()
    sched = Schedule(planned, store, never, listener=told)
    assert [r.trial.name for r in sched.results] == ["a"] and ("resumed", "a") in told.events
    launch = sched.next()
    assert (launch.trial.name, launch.round) == ("b", 1) and sched.next() is None

    # max_trials: the launches past it are told as left out, never started
    told = Recorder()
    sched = Schedule(planned, store, never, fresh=True, max_trials=1, listener=told)
    assert sched.next().trial.name == "a" and sched.next() is None
    assert [line for line in told.lines if "left out (max_trials=1)" in line] and len(told.lines) == 3


def test_repeats_auto_waits_for_the_launches_in_flight_then_asks_one_at_a_time(store, tmp_path):
    """As on Ray: every planned launch may be in flight at once; auto's extra launch is asked for only once all
    have ended (it reads their rows), and a failing extra launch ends that chapter's extras."""
    planned = _planned(tmp_path)
    asked = []

    def more(store, trials):
        asked.append(len(store.runs()))
        return trials[0]  # the pair never separates

    sched = Schedule(planned, store, more)
    flying = []
    while (launch := sched.next()) is not None:
        flying.append(launch)
    assert len(flying) == 4 and asked == []  # nothing asked while launches are out
    for launch in flying:
        sched.finished(launch, _ok(store, launch))
    extra = sched.next()
    assert (extra.trial.name, extra.round, extra.label) == ("a", None, " +1") and asked == [4]
    sched.finished(extra, TrialResult(extra.trial, "", "failed", "did not start"))
    assert sched.next() is None and asked == [4]  # a failing extra is not asked for again
