"""Which run stands for a trial, on a real DuckDB file: the tie rule, resume's decision, one row per trial_key."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from qwen3lab.analysis import selection

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _runs(store, key: str, *statuses: str, trial: str = "t", later_by_h: int = 0) -> list[str]:
    ids = []
    for i, status in enumerate(statuses):
        run_id = store.begin_run(run_id=f"{key}-{i}-{status}", experiment="e", chapter="c", trial=trial,
                                 trial_key=key, started_at=T0 + timedelta(hours=later_by_h, minutes=i))
        store.finish_run(run_id, status, None if status == "ok" else f"why {status}")
        ids.append(run_id)
    return ids


def test_an_ok_run_stands_over_newer_failures_and_a_newer_ok_over_it(store):
    ok, failed, interrupted = _runs(store, "k1", "ok", "failed", "interrupted")
    older_ok, newer_ok = _runs(store, "k2", "ok", "ok")
    got = selection.standing(store.runs(experiment="e"))
    assert dict(zip(got.trial_key, got.run_id)) == {"k1": ok, "k2": newer_ok}
    assert older_ok not in set(got.run_id) and failed not in set(got.run_id)


def test_without_an_ok_run_the_newest_that_ended_stands(store):
    _, skipped, _ = _runs(store, "k1", "failed", "skipped", "interrupted")
    got = selection.standing(store.runs(experiment="e"))
    assert list(got.run_id) == [skipped]
    only_running = _runs(store, "k2", "running")
    got = selection.standing(store.runs(experiment="e"), ["k2", "k1"])
    assert list(got.run_id) == [only_running[0], skipped]  # in the order asked for


def test_measured_keeps_only_trials_whose_standing_run_is_ok(store):
    _runs(store, "k1", "ok", "failed")
    _runs(store, "k2", "oom")
    got = selection.measured(store.runs(experiment="e"))
    assert list(got.trial_key) == ["k1"] and set(got.status) == {"ok"}


def test_previous_run_decides_resume(store):
    assert selection.previous_run(store, "nothing-yet", retry_failed=False) is None
    ok = _runs(store, "ok", "failed", "ok")[1]
    assert selection.previous_run(store, "ok", retry_failed=True) == (ok, "ok")
    failed = _runs(store, "failed", "failed")[0]
    assert selection.previous_run(store, "failed", retry_failed=False) == (failed, "failed")
    assert selection.previous_run(store, "failed", retry_failed=True) is None
    skipped = _runs(store, "skipped", "skipped")[0]
    assert selection.previous_run(store, "skipped", retry_failed=False) == (skipped, "skipped")
    assert selection.previous_run(store, "skipped", retry_failed=False, runnable_here=True) is None
    _runs(store, "stopped", "ok", "interrupted")  # an interrupted re-run does not hide the ok run
    assert selection.previous_run(store, "stopped", retry_failed=False)[1] == "ok"
    _runs(store, "only-stopped", "interrupted")
    assert selection.previous_run(store, "only-stopped", retry_failed=False) is None


def test_current_shows_each_trial_name_once_by_its_newest_definition(store):
    _runs(store, "old-definition", "ok", "ok")
    newer = _runs(store, "new-definition", "failed", later_by_h=1)[0]  # the same name, edited in the file, run later
    _runs(store, "other", "ok", trial="u")
    got = selection.current(store.runs(experiment="e"))
    assert dict(zip(got.trial, got.run_id))["t"] == newer and sorted(got.trial) == ["t", "u"]
    assert list(selection.current(store.runs(experiment="e"), measured_only=True).trial) == ["u"]
