"""Grid vs optuna for capacity on the embedded default (a benchmark: prints a table, writes JSON; not a test).

    .venv/bin/python bench/capacity_search_bench.py                 # the 12-configuration grid, then optuna replays
    .venv/bin/python bench/capacity_search_bench.py --quick         # 4 configurations, fewer requests (a smoke run)
    .venv/bin/python bench/capacity_search_bench.py --db FILE       # resume: a configuration measured there is reused
    .venv/bin/python bench/capacity_search_bench.py --grid-json bench/results/capacity_search_T.json --live-seeds 3
                                                   # (d) only, against an earlier run's grid

(a) The grid: every configuration's capacity, measured for real (one server per configuration, capacity.
    measure_capacity), with its wall time (server start + load points).
(b) optuna (TPE) with the same objective and a budget of as many trials, over >= 3 seeds. Each seed is replayed on
    the grid's measurements: a suggestion costs the wall time its configuration took in the grid, and returns the
    capacity measured there. This isolates the sampler (what the issue's target compares) from machine noise; a
    live optuna run is `qwen3lab search` on experiments/cpu-tiny-search.yaml.
    Reported: wall time until a configuration within 5% of the grid's best capacity was found, as a share of the
    grid's total time (target: at most 40%).
(c) Repeatability: the grid's first configuration measured on a second launch (capacity.launches: 2): the two capacities
    should agree within the tolerance.
(d) `--live-seeds N`: the product itself, live: `qwen3lab search` (the CLI, a subprocess, a fresh DuckDB) of the same
    space, objective, SLOs and capacity settings with TPE seeds 0..N-1 and a wall budget of 40% of the grid's time,
    each suggestion measured anew on a fresh server. Time to a configuration within 5% of the grid's best = the
    measuring time of the suggestions up to the first such one, plus the whole command's own overhead (its start,
    pre-flight, optuna; all of it, also what came after): an upper bound. A seed that finds none within the budget
    has missed the target.
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen3lab.experiment import preflight  # noqa: E402
from qwen3lab.hardware.catalogue import cpu_topology  # noqa: E402
from qwen3lab.experiment.spec import Capacity, EngineConfig, SLO, Trial, Workload  # noqa: E402
from qwen3lab.measure import capacity as cap  # noqa: E402
from qwen3lab.store import Store  # noqa: E402

SPACE = {"max_num_seqs": [2, 4, 8, 16], "max_num_batched_tokens": [256, 512, 2048]}
QUICK_SPACE = {"max_num_seqs": [2, 8], "max_num_batched_tokens": [256, 2048]}
ENGINE = dict(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=2048, enforce_eager=True,
              env={"VLLM_CPU_KVCACHE_SPACE": "1"})
SLO_ = SLO(ttft_ms=1500, tpot_ms=60)


def trial_for(params: dict, requests: int, launches: int = 1) -> Trial:
    spec = Capacity(axis="concurrency", start=2, min_attainment=0.9, tolerance=0.15, max_points=6,
                    requests_per_point=requests, warmup_per_point=2, launches=launches)
    name = ",".join(f"{k}={v}" for k, v in params.items())
    return Trial(experiment="capacity-bench", chapter="grid", name=name, engine=EngineConfig(**ENGINE, **params),
                 workload=Workload(mix="fixed-128", num_requests=requests, seed=0, capacity=spec), slo=SLO_)


def measure(trial: Trial, store: Store, machine) -> dict:
    done = cap.stored_capacity(store, trial)
    t0 = time.monotonic()
    result = done or cap.capacity_of(trial, store, ROOT / "runs" / "bench", machine=machine, gpu_id="cpu",
                                     done=cap.finished_launches(store, trial))
    wall = ((done.start_s or 0.0) + done.measure_s) if done else time.monotonic() - t0
    print(f"  {trial.name:<40} {result.status:>10} capacity {result.capacity} [{result.low}, {result.high}] "
          f"{len(result.points)} points, {wall:.0f} s", flush=True)
    return {"trial": trial.name, "capacity": result.capacity, "low": result.low, "high": result.high,
            "status": result.status, "points": len(result.points), "wall_s": wall, "search_id": result.search_id,
            "launches": [{"search_id": r.search_id, "capacity": r.capacity, "low": r.low, "high": r.high}
                         for r in result.launches or [result]]}


def replay(grid: list[dict], params: list[dict], seed: int, within: float = 0.05) -> dict:
    """optuna TPE over the measured grid: time (grid wall seconds) until a capacity within `within` of the best."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table = {json.dumps(p, sort_keys=True): g for p, g in zip(params, grid)}
    best = max(g["capacity"] or 0 for g in grid)
    space = {k: sorted({p[k] for p in params}) for k in params[0]}
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=3, multivariate=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    spent, found_at, seen = 0.0, None, {}
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()}
    budget = len(grid)
    measured = asks = 0
    while measured < budget and asks < 50 * budget:  # TPE may repeat itself: bounded
        asks += 1
        asked = study.ask(dists)
        key = json.dumps(asked.params, sort_keys=True)
        g = table[key]
        if key not in seen:  # a repeat suggestion is answered from the store: no time spent
            seen[key] = True
            spent += g["wall_s"]
            measured += 1
        study.tell(asked, g["capacity"] or 0.0)
        if found_at is None and (g["capacity"] or 0) >= (1 - within) * best:
            found_at = spent
            break
    return {"seed": seed, "time_to_within_5pct_s": found_at, "trials_measured": measured}


def search_yaml(space: dict, requests: int, seed: int, budget_s: float) -> str:
    """The experiment file `qwen3lab search` reads: the grid's engine, workload, capacity settings and SLOs."""
    import yaml

    t = trial_for({}, requests)
    capacity = t.workload.capacity.model_dump(exclude_none=True)
    return yaml.safe_dump({
        "name": f"capacity-bench-live-{seed}", "gpu": "cpu", "engine": ENGINE,
        "workload": {"mix": "fixed-128", "num_requests": requests, "seed": 0, "capacity": capacity},
        "slo": SLO_.model_dump(exclude_none=True),
        "search": {"space": {f"engine.{k}": v for k, v in space.items()}, "objective": "capacity", "sampler": "tpe",
                   "seed": seed, "budget": {"trials": len(list(itertools.product(*space.values()))),
                                            "wall_time_s": round(budget_s)}}}, sort_keys=False)


def grid_best_suggested_at(history: list[dict], grid: list[dict], overhead_s: float, within: float = 0.05) -> float | None:
    """When the search first measured a configuration whose *grid* capacity is within `within` of the grid's best:
    the sampler's part, apart from how the live measurement of that configuration came out."""
    best = max(g["capacity"] or 0 for g in grid)
    by_name = {g["trial"]: g["capacity"] or 0 for g in grid}
    spent = overhead_s
    for h in history:
        spent += h["wall_s"] or 0
        name = ",".join(f"{k.removeprefix('engine.')}={v}" for k, v in h["params"].items())
        if by_name.get(name, 0) >= (1 - within) * best:
            return spent
    return None


def live(space: dict, requests: int, seed: int, grid: list[dict], grid_s: float, within: float = 0.05) -> dict:
    """(d): one live `qwen3lab search`, timed from the command's start to its exit."""
    import os
    import subprocess
    import tempfile

    best = max(g["capacity"] or 0 for g in grid)

    with tempfile.TemporaryDirectory(prefix="capacity-live-") as tmp:
        exp = Path(tmp) / "search.yaml"
        exp.write_text(search_yaml(space, requests, seed, 0.4 * grid_s))
        t0 = time.monotonic()
        got = subprocess.run([sys.executable, "-m", "qwen3lab", "search", str(exp), "--db", str(Path(tmp) / "s.duckdb"),
                              "--runs-dir", str(Path(tmp) / "runs"), "--json"], capture_output=True, text=True,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        total = time.monotonic() - t0
    if got.returncode not in (0, 1):
        raise SystemExit(f"qwen3lab search (seed {seed}) failed ({got.returncode}): {got.stderr[-2000:]}")
    history = json.loads(got.stdout)["history"]
    measuring = sum(h["wall_s"] or 0 for h in history)
    found_at, spent = None, 0.0
    for h in history:
        spent += h["wall_s"] or 0
        if h["state"] == "complete" and (h["value"] or 0) >= (1 - within) * best:
            found_at = spent + (total - measuring)  # the command's own overhead, all of it: an upper bound
            break
    suggested_at = grid_best_suggested_at(history, grid, total - measuring, within)
    print(f"  live seed {seed}: {len(history)} suggestions in {total:.0f} s; "
          + (f"within 5% after {found_at:.0f} s ({found_at / grid_s:.0%} of the grid)" if found_at is not None
             else "none within 5% of the grid's best"), flush=True)
    return {"seed": seed, "time_to_within_5pct_s": found_at, "grid_best_suggested_at_s": suggested_at,
            "total_s": total, "overhead_s": total - measuring,
            "history": [{k: h[k] for k in ("number", "params", "state", "value", "low", "high", "wall_s")}
                        for h in history]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 configurations and 12 requests a point (smoke run)")
    ap.add_argument("--db", default=str(ROOT / "bench" / "results" / "capacity_bench.duckdb"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-repeat", action="store_true", help="skip (c), the second measurement of one configuration")
    ap.add_argument("--live-seeds", type=int, default=0, help="(d): live `qwen3lab search` runs, seeds 0..N-1")
    ap.add_argument("--grid-json", help="take (a) from an earlier run's JSON instead of measuring it (skips (c))")
    args = ap.parse_args(argv)
    space = QUICK_SPACE if args.quick else SPACE
    requests = 12 if args.quick else 24
    params = [dict(zip(space, values)) for values in itertools.product(*space.values())]
    store, machine = Store(args.db), preflight.Machine.local()
    t_start = time.monotonic()
    if args.grid_json:
        earlier = json.loads(Path(args.grid_json).read_text())
        space, requests, grid = earlier["space"], earlier["requests_per_point"], earlier["grid"]
        params = [dict(zip(space, values)) for values in itertools.product(*space.values())]
        args.no_repeat = True
        print(f"(a) grid: {len(params)} configurations, from {args.grid_json}", flush=True)
    else:
        print(f"(a) grid: {len(params)} configurations", flush=True)
        grid = [measure(trial_for(p, requests), store, machine) for p in params]
    grid_s = sum(g["wall_s"] for g in grid)
    best = max(grid, key=lambda g: g["capacity"] or 0)
    print(f"(b) optuna TPE replayed on the grid, {args.seeds} seeds", flush=True)
    seeds = [replay(grid, params, seed) for seed in range(args.seeds)]
    shares = [s["time_to_within_5pct_s"] / grid_s for s in seeds if s["time_to_within_5pct_s"] is not None]
    lives = []
    if args.live_seeds:
        print(f"(d) live `qwen3lab search`, {args.live_seeds} seeds, wall budget {0.4 * grid_s:.0f} s each", flush=True)
        lives = [live(space, requests, seed, grid, grid_s) for seed in range(args.live_seeds)]
    repeat = None
    if not args.no_repeat:
        print("(c) the first configuration again: capacity.launches 2 (its grid search is the first launch)", flush=True)
        again = measure(trial_for(params[0], requests, launches=2), store, machine)["launches"][-1]
        first = grid[0]
        gap = abs((again["capacity"] or 0) - (first["capacity"] or 0)) / max(first["capacity"] or 1, 1e-9)
        # Two figures, not one: the relative gap against the tolerance, and whether the second capacity lies in
        # the first's bracket (at small integer capacities one step is wider than the tolerance).
        repeat = {"first": first, "second": again, "relative_gap": gap, "tolerance": 0.15,
                  "agrees": gap <= 0.15,
                  "in_first_bracket": first["low"] <= (again["capacity"] or 0) <= first["high"]}
    print()
    print(f"{'configuration':<40} {'capacity':>9} {'bracket':>14} {'wall s':>7}")
    for g in grid:
        print(f"{g['trial']:<40} {g['capacity'] if g['capacity'] is not None else '-':>9} "
              f"{'[' + str(g['low']) + ', ' + str(g['high']) + ']':>14} {g['wall_s']:>7.0f}")
    print(f"\ngrid: {grid_s:.0f} s, best {best['trial']} at {best['capacity']}")
    for s in seeds:
        t = s["time_to_within_5pct_s"]
        print(f"optuna seed {s['seed']}: within 5% of the best after {t:.0f} s = {t / grid_s:.0%} of the grid's time "
              f"({s['trials_measured']} configurations)" if t is not None else f"optuna seed {s['seed']}: not found")
    if shares:
        print(f"median share of the grid's time: {statistics.median(shares):.0%} (target <= 40%)")
    for s in lives:
        t = s["time_to_within_5pct_s"]
        print(f"live search seed {s['seed']}: " + (f"within 5% of the grid's best after {t:.0f} s = {t / grid_s:.0%} of "
              f"the grid's time" if t is not None else "none within 5% inside 40% of the grid's time (MISSED)")
              + f" ({len(s['history'])} suggestions, command overhead {s['overhead_s']:.0f} s); a configuration "
              + (f"within 5% by the grid's figures measured after {s['grid_best_suggested_at_s']:.0f} s = "
                 f"{s['grid_best_suggested_at_s'] / grid_s:.0%}" if s["grid_best_suggested_at_s"] is not None
                 else "within 5% by the grid's figures never suggested"))
    if lives:
        live_shares = [(s["time_to_within_5pct_s"] or float("inf")) / grid_s for s in lives]
        print(f"live median share: {statistics.median(live_shares):.0%} (target <= 40%); by the grid's figures "
              f"(the sampler alone): {statistics.median((s['grid_best_suggested_at_s'] or float('inf')) / grid_s for s in lives):.0%}")
    if repeat:
        print(f"repeat: {repeat['first']['capacity']} then {repeat['second']['capacity']}: relative gap "
              f"{repeat['relative_gap']:.0%} ({'within' if repeat['agrees'] else 'OUTSIDE'} the 15% tolerance), "
              f"{'inside' if repeat['in_first_bracket'] else 'outside'} the first bracket "
              f"[{repeat['first']['low']:g}, {repeat['first']['high']:g}]")
    out = ROOT / "bench" / "results" / f"capacity_search_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"space": space, "requests_per_point": requests, "grid": grid, "grid_s": grid_s,
                               "optuna_replay": seeds, "median_share": statistics.median(shares) if shares else None,
                               "live_search": lives,
                               "repeat": repeat, "host": platform.node(), "cpu": cpu_topology(), "wall_s": time.monotonic() - t_start},
                              indent=2, default=str))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
