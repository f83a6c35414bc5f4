"""Adaptive search over launch flags: optuna suggests a configuration, qwen3lab measures it like any trial.

The experiment's `search:` gives the space (dotted engine/workload keys), the objective (capacity, measured by
`capacity.capacity_of` on `capacity.launches` launches, or goodput at the workload's load, measured by
`runner.run_trial`), the budget and the sampler (TPE, random, or the grid of a space of lists; NSGA-II when two
objectives are asked).
Pre-flight judges every suggestion before a launch: what it rejects or cannot run here is stored as pruned
with the reason and never launched. Crashes and OOMs are stored as failed and told to the sampler as the
worst value (a configuration that does not serve has no capacity), so it steers away. Every suggestion is a
row of `search_trials`; a study resumes from DuckDB alone: stored trials are told to a fresh optuna study,
and a suggestion that was measured already is answered from the store, never measured again. Suggestions are
measured here one at a time, or on a Ray cluster as many at once as it has free slots (ask/tell as they end):
measure/suggestions.py places and measures them; this module is the study (space, sampler, resume, budget).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from qwen3lab.errors import SpecError, SpecErrors, require
from qwen3lab.experiment import files as xp
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import SEARCH_OBJECTIVES, Range, Search, Trial, stable_hash
from qwen3lab.measure import engine
from qwen3lab.measure.events import Listener
from qwen3lab.measure.suggestions import Here, OnRay, Pending, SearchTrial, told
from qwen3lab.store import Store

MEASURED = ("complete", "failed")  # states that cost a launch and count towards the budget
GIVE_UP_AFTER = 25  # suggestions in a row that were pruned or repeated: the feasible space is exhausted


@dataclass
class SearchResult:
    study: str
    objectives: list[str]
    history: list[SearchTrial] = field(default_factory=list)
    best: SearchTrial | None = None
    best_trial: Trial | None = None
    stopped: str = ""
    sampler: str = ""  # optuna's sampler class: NSGAIISampler when two objectives are asked
    front: list[tuple[SearchTrial, Trial]] = field(default_factory=list)  # the Pareto front of two objectives

    def as_dict(self) -> dict:
        best = None
        if self.best is not None:
            best = {**_described(self.best, self.best_trial), "objective": self.objectives[0],
                    "value": self.best.value, "interval": [self.best.low, self.best.high]}
        front = [{**_described(t, trial), "values": dict(zip(self.objectives, (t.value, t.value2))),
                  "interval": [t.low, t.high]} for t, trial in self.front]
        return {"study": self.study, "objectives": self.objectives, "sampler": self.sampler, "stopped": self.stopped,
                "best": best, "front": front, "history": [vars(t) for t in self.history]}


def _described(t: SearchTrial, trial: Trial | None) -> dict:
    """A measured configuration as `--json` prints it: its name, flags, stored rows and launch command."""
    cfg = trial.engine if trial else None
    return {"number": t.number, "trial": trial.name if trial else None, "params": t.params, "run_id": t.run_id,
            "search_id": t.search_id,
            "launch_command": engine.launch_command(cfg) if cfg is not None and cfg.kind == "vllm" else None}


def study_key(exp: xp.Experiment, search: Search) -> str:
    """One study per experiment base + space + objective + sampler: the budget may change between resumes."""
    return f"{exp.name}-" + stable_hash({
        "engine": exp.engine, "workload": exp.workload, "slo": exp.slo,
        "search": search.model_dump(mode="json", exclude={"budget"})})[:10]


def distributions(search: Search) -> dict:
    optuna = require("optuna", "pip install optuna")
    d = optuna.distributions
    out = {}
    for key, values in search.space.items():
        if isinstance(values, Range):
            if values.whole:
                out[key] = d.IntDistribution(int(values.low), int(values.high), log=values.log,
                                             step=int(values.step or 1))
            else:
                out[key] = d.FloatDistribution(values.low, values.high, log=values.log, step=values.step)
        else:
            out[key] = d.CategoricalDistribution(values)
    return out


def grid(search: Search) -> list[dict]:
    """Every point of a space of lists, in the written order."""
    ranges = [k for k, v in search.space.items() if isinstance(v, Range)]
    if ranges:
        raise SpecError(f"search.space.{ranges[0]}", search.space[ranges[0]].model_dump(), "lists of values with "
                        "sampler: grid", "write the values out as a list, or use sampler: tpe or random")
    keys = list(search.space)
    return [dict(zip(keys, values)) for values in itertools.product(*(search.space[k] for k in keys))]


def _sampler(search: Search):
    optuna = require("optuna", "pip install optuna")
    if len(search.objectives) == 2:
        return optuna.samplers.NSGAIISampler(seed=search.seed)
    if search.sampler == "tpe":
        # few startup trials: a search's budget is a handful of launches
        return optuna.samplers.TPESampler(seed=search.seed, n_startup_trials=3, multivariate=True)
    return optuna.samplers.RandomSampler(seed=search.seed)


def trials_of(df) -> list[SearchTrial]:
    """Stored `search_trials` rows (of one study) as SearchTrials: a resumed study's history, the dashboard's."""
    import json

    nan = lambda v: None if v is None or v != v else v  # noqa: E731
    return [SearchTrial(int(r.number), json.loads(r.params_json), r.state, nan(r.value), nan(r.value2), nan(r.low),
                        nan(r.high), nan(r.reason), nan(r.trial_key), nan(r.run_id), nan(r.search_id), nan(r.wall_s))
            for r in df.itertuples()] if not df.empty else []


def best_of(search: Search, history: list[SearchTrial]) -> SearchTrial | None:
    done = [t for t in history if t.state == "complete" and t.value is not None]
    if not done:
        return None
    sign = 1 if SEARCH_OBJECTIVES[search.objectives[0]] == "maximize" else -1
    return max(done, key=lambda t: (sign * t.value, -t.number))


def pareto_front(objectives: list[str], history: list[SearchTrial]) -> list[SearchTrial]:
    """The measured configurations no other one beats on both objectives (optuna's `study.best_trials`), in
    the order they were suggested; empty with one objective. Only trials measured with both values take part:
    the sampler was told the worst value for a missing one, which is no point to draw or launch."""
    done = [t for t in history if t.state == "complete" and t.value is not None and t.value2 is not None]
    if len(objectives) != 2 or not done:
        return []
    optuna = require("optuna", "pip install optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=[SEARCH_OBJECTIVES[o] for o in objectives])
    for i, t in enumerate(done):
        study.add_trial(optuna.trial.create_trial(values=[t.value, t.value2], user_attrs={"i": i}))
    return sorted((done[b.user_attrs["i"]] for b in study.best_trials), key=lambda t: t.number)


def run_search(path: str, db: str, runs_dir: str = "runs", budget_trials: int | None = None,
               budget_s: float | None = None, fresh: bool = False, listener: Listener | None = None,
               executor: str = "local", address: str | None = None) -> SearchResult:
    """Run (or resume) the experiment's search until its budget is spent; every suggestion is stored. With
    executor "ray", as many suggestions are measured at once as the cluster has free slots."""
    optuna = require("optuna", "pip install optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    listener = listener or Listener()
    exp = xp.load(path)
    if exp.search is None:
        raise SpecError("search", None, "a search: {space, objective, budget, sampler} section",
                        "add one (see experiments/cpu-tiny-search.yaml)", str(path))
    search = exp.search
    budget = (budget_trials or search.budget.trials, budget_s or search.budget.wall_time_s)
    if budget == (None, None):
        raise SpecError("search.budget", None, "trials: N and/or wall_time_s: T", "set a budget, or pass --budget-trials")
    dists = distributions(search)
    queue = grid(search) if search.sampler == "grid" else None
    machine = preflight.Machine.local()
    store = Store(db)
    study_id = study_key(exp, search)
    history = [] if fresh else trials_of(store.search_trials(study_id))
    for t in history:  # a session that was stopped left its trial unfinished: it is measured again below
        if t.state in ("running", "interrupted"):
            t.state = "interrupted"
            _close_stale(store, study_id, t)
    if fresh and not store.search_trials(study_id).empty:
        study_id += "-" + time.strftime("%Y%m%d%H%M%S")
    directions = [SEARCH_OBJECTIVES[o] for o in search.objectives]
    sampler = _sampler(search)
    study = optuna.create_study(directions=directions, sampler=sampler)
    by_params: dict[str, SearchTrial] = {}
    for t in history:
        key = stable_hash(t.params)
        if t.state in MEASURED:
            by_params[key] = t
            study.add_trial(optuna.trial.create_trial(params=t.params, distributions=dists, values=told(search, t)))
        elif t.state == "pruned":
            by_params[key] = t
            study.add_trial(optuna.trial.create_trial(params=t.params, distributions=dists,
                                                      state=optuna.trial.TrialState.PRUNED))
    if queue is not None:
        queue = [p for p in queue if stable_hash(p) not in by_params]
    result = SearchResult(study_id, search.objectives, list(history), sampler=type(sampler).__name__)
    number = max((t.number for t in history), default=-1) + 1
    started, idle = time.monotonic(), 0
    listener.started(f"search {study_id}", budget[0])
    here = dict(search=search, store=store, runs_dir=runs_dir, path=str(path), gpu_id=exp.gpu, listener=listener,
                study_id=study_id)
    measurer = OnRay(address=address, **here) if executor == "ray" else Here(machine=machine, **here)

    def stop_reason() -> str | None:
        used = sum(t.state in MEASURED for t in result.history) + len(measurer)
        if budget[0] is not None and used >= budget[0]:
            return f"budget of {budget[0]} trials spent"
        if budget[1] is not None and time.monotonic() - started >= budget[1]:
            return f"budget of {budget[1]:g} s spent"
        if queue is not None and not queue:
            return "every grid point done"
        if idle >= GIVE_UP_AFTER:
            return f"{GIVE_UP_AFTER} suggestions in a row were pruned or measured already"
        return None

    def record(got: SearchTrial, asked, trial: Trial | None) -> None:
        _tell(study, asked, search, got)
        by_params[stable_hash(got.params)] = got
        result.history.append(got)
        best, value = best_of(search, result.history), "-" if got.value is None else f"{got.value:g}"
        listener.finished(trial, got.state, f"#{got.number} {value} {got.params}"
                          + (f" ({got.reason})" if got.reason else "") + (f"; best so far {best.value:g}" if best else ""))

    with measurer:
        while True:
            stop = stop_reason()
            while stop is None and len(measurer) < measurer.slots and not measurer.ready:
                if queue is not None:
                    study.enqueue_trial(queue.pop(0))
                asked = study.ask(dists)
                params = dict(asked.params)
                seen = by_params.get(stable_hash(params))
                if seen is not None:  # measured (or pruned) already: answered from the store, never measured again
                    _tell(study, asked, search, seen)
                    idle += 1
                else:
                    pending = _judge(exp, search, params, number, study_id, store, machine, asked)
                    number += 1
                    if isinstance(pending, SearchTrial):  # pruned by pre-flight: never launched
                        record(pending, asked, None)
                        idle += 1
                    else:
                        measurer.submit(pending)
                        idle = 0
                stop = stop_reason()
            for pending, got in measurer.finished():
                record(got, pending.asked, pending.trial)
                if got.state == "interrupted":
                    raise KeyboardInterrupt
            if stop is not None and not len(measurer) and not measurer.ready:
                result.stopped = stop
                break
    result.best = best_of(search, result.history)
    if result.best is not None:
        result.best_trial = xp.trial_from(exp, search.chapter, result.best.params)
    result.front = [(t, xp.trial_from(exp, search.chapter, t.params)) for t in pareto_front(search.objectives,
                                                                                           result.history)]
    return result


def _close_stale(store: Store, study_id: str, t: SearchTrial) -> None:
    """A trial a stopped session left unfinished: it, and a run or capacity search of it still `running`, are
    marked interrupted (a signal can land between a row's insert and the code that would have finished it).
    Two searches of one study at once are not supported: the second would close the first's rows."""
    why = "the search stopped mid-trial"
    store.finish_search_trial(study_id, t.number, "interrupted", reason=why)
    if t.trial_key:
        runs = store.runs(status="running")
        for run_id in runs[runs.trial_key == t.trial_key].run_id if not runs.empty else []:
            store.finish_run(run_id, "interrupted", why)
        searches = store.capacities(trial_key=t.trial_key)
        for search_id in searches[searches.status == "running"].search_id if not searches.empty else []:
            store.finish_capacity(search_id, "interrupted", why)


def _tell(study, asked, search: Search, t: SearchTrial) -> None:
    import optuna

    if t.state == "pruned" or t.state == "interrupted":
        study.tell(asked, state=optuna.trial.TrialState.PRUNED)
    else:
        values = told(search, t)
        study.tell(asked, values[0] if len(values) == 1 else values)


def _judge(exp, search: Search, params: dict, number: int, study_id: str, store: Store, machine,
           asked) -> "Pending | SearchTrial":
    """Judge a suggestion before any launch: pruned (stored, with the reason) when infeasible, else stored as
    running and handed back to be measured."""
    base = dict(study=study_id, number=number, experiment=exp.name, params_json=params,
                objectives=",".join(search.objectives))
    try:
        trial = xp.trial_from(exp, search.chapter, params)
        verdict = preflight.check(trial, machine, exp.gpu)
        why = "; ".join(str(e) for e in verdict.errors) or verdict.skip
    except SpecErrors as exc:
        trial, verdict, why = None, None, "; ".join(str(e) for e in exc.errors)
    if why:
        out = SearchTrial(number, params, "pruned", reason=f"pre-flight: {why}",
                          trial_key=trial.key if trial else None)
        store.add_search_trial(**base, state="pruned", reason=out.reason, trial_key=out.trial_key,
                               trial=trial.name if trial else xp.override_name(params))
        store.finish_search_trial(study_id, number, "pruned")
        return out
    store.add_search_trial(**base, state="running", trial_key=trial.key, trial=trial.name,
                           config_hash=trial.engine.config_hash())
    return Pending(number, params, asked, trial, verdict)


def importances(trials, maximize: bool = True) -> dict[str, float]:
    """optuna's parameter importance (fANOVA) over a study's stored rows (`store.search_trials`): which
    flags moved the objective. Empty with fewer than three measured trials or nothing to attribute."""
    import json

    optuna = require("optuna", "pip install optuna")
    done = trials[trials.state == "complete"].dropna(subset=["value"]) if not trials.empty else trials
    if len(done) < 3:
        return {}
    params = [json.loads(p) for p in done.params_json]
    dists = {}
    for key in params[0]:
        values = [p.get(key) for p in params]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            if min(values) < max(values):
                dists[key] = optuna.distributions.FloatDistribution(float(min(values)), float(max(values)))
        elif len({json.dumps(v) for v in values}) > 1:
            dists[key] = optuna.distributions.CategoricalDistribution(sorted({v for v in values}, key=str))
    if not dists:
        return {}
    study = optuna.create_study(direction="maximize" if maximize else "minimize")
    for p, value in zip(params, done.value):
        study.add_trial(optuna.trial.create_trial(params={k: p[k] for k in dists}, distributions=dists,
                                                  value=float(value)))
    try:
        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError, ZeroDivisionError):
        return {}  # every trial had the same value: nothing to attribute
