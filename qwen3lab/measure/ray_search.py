"""Search in parallel on a Ray cluster: optuna asks for as many trials as the cluster has free slots, and is
told each result as it finishes (ask/tell), so a search keeps every node busy instead of one trial at a time.

The caller owns the search space and the score: `make_trial` turns an optuna trial into a qwen3lab Trial (it
calls suggest_*), `score` turns the stored run (store.Store.run) into the value optuna optimizes. A trial that
does not end ok is told as failed, so optuna samples elsewhere; its run stays stored with its reason.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qwen3lab.errors import SpecErrors
from qwen3lab.experiment.spec import Trial
from qwen3lab.measure import ray_executor, runner
from qwen3lab.store import Store


def optimize(study, make_trial: Callable[[object], Trial], score: Callable[[dict], float], n_trials: int, db: str,
             gpu_id: str | None, runs_dir: str | Path = "runs", experiment_path: str | None = None,
             address: str | None = None, listener=None, in_flight: int | None = None) -> list[runner.TrialResult]:
    """Run n_trials of the study on the cluster, at most `in_flight` at once (default: the free slots).
    `listener` (an executor.Listener) is told of each trial as it starts and ends."""
    import optuna

    from qwen3lab.measure.executor import Listener

    ray = ray_executor.connect(address)
    store = Store(db)
    job = ray_executor.job_for(gpu_id, runs_dir, experiment_path)
    first = study.ask()
    trial = make_trial(first)
    errors = ray_executor.cluster_errors([trial], gpu_id, ray.nodes())
    if errors:  # a slot is what the first trial needs: the cluster must be able to run one
        study.tell(first, state=optuna.trial.TrialState.FAIL)
        raise SpecErrors(errors)
    slots = in_flight or max(ray_executor.free_slots(ray, trial, gpu_id), 1)
    results = []
    with ray_executor.TrialPool(ray, store, job, listener or Listener()) as pool:
        pool.submit(trial, tag=first)
        asked = 1
        while asked < n_trials or pool:
            while asked < n_trials and len(pool) < slots:
                ask = study.ask()
                pool.submit(make_trial(ask), tag=ask)
                asked += 1
            for ask, result in pool.step():
                results.append(result)
                if result.status == "ok":
                    study.tell(ask, score(store.run(result.run_id)))
                else:
                    study.tell(ask, state=optuna.trial.TrialState.FAIL)
    return results
