"""A/A calibration of the verdicts: one configuration entered as two trials can only differ by chance, so a
"better" or "worse" between them is a false verdict. Target: at most 5% at 95% confidence, at 2, 3 and 5
launches a trial.

Resampling mode (the default): every ok, reliable launch stored for one configuration (same trial key or the
same configuration hash, with one comparability key: same requests, tokenizer, machine, build) is a pool; each
A/A pair draws 2k distinct launches from a pool and files k as trial A, k as trial B, then asks
compare.difference (Welch's t over launch figures) for each metric. Pools from the repo's committed data:
tests/data (the dashboard and verdicts fixtures) and experiments/results/*.duckdb; `--db` adds others.

Fresh mode (`--fresh N`): measures an A/A chapter on the embedded default first (real vLLM on the CPU, the tiny
Qwen3, the demo's scheduler workload: 80 requests a launch), two trials of one configuration interleaved
A B A B, N launches each, into `--fresh-db`; then resamples those launches as above, and also reads the
chapter as measured (its N + N launches as the two trials).

    python bench/aa_bench.py                              # committed launches only
    python bench/aa_bench.py --fresh 5 --fresh-db aa.duckdb   # 10 fresh launches (~20 min on 2 cores), then both
    python bench/aa_bench.py --db aa.duckdb               # resample an earlier fresh run again
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen3lab.analysis import comparable, compare, selection, stats  # noqa: E402
from qwen3lab.experiment.spec import SLO  # noqa: E402
from qwen3lab.store import Store  # noqa: E402

SIDES = (2, 3, 5)
TARGET = 0.05
# Goodput without latency limits (every completed request counts): on a loaded machine the demo's limits leave
# a goodput of 0 on both sides, and 0 against 0 would pass the check without testing anything.
NO_SLO = SLO()
FRESH_YAML = """
name: aa-bench
description: One configuration entered as two trials (A/A), interleaved, as the demo's scheduler chapter measures.
gpu: cpu
engine:
  model: builtin:qwen3-tiny
  load_format: dummy
  max_model_len: 2048
  max_num_seqs: 128
  env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
workload: {{num_requests: 80, warmup_requests: 8, mix: fixed-128, concurrency: 16, seed: 0}}
slo: {{ttft_p95_ms: 1500, tpot_p95_ms: 50}}
chapters:
  aa:
    repeats: {repeats}
    trials:
      - {{name: a}}
      - {{name: b}}
"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", action="append", default=[], help="Another DuckDB file whose launches to pool (repeatable).")
    p.add_argument("--fresh", type=int, default=0, metavar="N",
                   help="First measure N launches of each of two identical trials on the embedded default (0: none).")
    p.add_argument("--fresh-db", default="aa-bench.duckdb", help="Where --fresh stores its launches.")
    p.add_argument("--pairs", type=int, default=200, help="A/A pairs drawn per pool and launch count (at most).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "aa_bench.json"))
    args = p.parse_args(argv)
    if args.fresh < 0 or args.pairs < 1:
        p.error(f"--fresh {args.fresh} / --pairs {args.pairs}: use --fresh 0 or more (0: no fresh launches) and "
                "--pairs 1 or more")
    return args


FIXTURES = [ROOT / "tests" / "data" / d for d in ("dashboard", "verdicts")]


def committed(where: Path, fixtures_only: bool = False) -> list[Path]:
    """DuckDB files in `where` holding the repo's committed real runs: the dashboard and verdicts fixtures of
    tests/data (replayed through the store), and copies of experiments/results/*.duckdb."""
    from tests import dashdata

    out = []
    for fixture in sorted(f for d in FIXTURES for f in d.glob("*.json.gz")):
        out.append(where / (fixture.name.removesuffix(".json.gz") + ".duckdb"))
        dashdata.build(out[-1], with_extras=False, fixture=fixture)
    for db in [] if fixtures_only else sorted((ROOT / "experiments" / "results").glob("*.duckdb")):
        shutil.copy(db, where / db.name)  # a copy: opening migrates, the committed file stays as it is
        out.append(where / db.name)
    return out


def pools(db: Path, include_unreliable: bool = False) -> list[tuple[str, list[compare.RunData]]]:
    """(name, launches) per configuration of one database: ok (and reliable unless asked), one comparability key
    each; no capacity load point or soak window (pieces of a larger measurement)."""
    store = Store(db)
    runs = store.runs(status="ok")
    if runs.empty:
        return []
    runs = selection.standalone(runs if include_unreliable else runs[~compare.unreliable(runs)])
    loaded = compare.load_runs(store, list(runs.run_id))
    by: dict[tuple, list[compare.RunData]] = {}
    for r in loaded:
        by.setdefault((r.row.get("config_hash") or r.trial_key, comparable.comparability_key(r.row)), []).append(r)
    return [(f"{db.name}:{v[0].label}", v) for v in by.values()]


def draws(pool: list, k: int, n_pairs: int, rng: np.random.Generator) -> list[tuple[list, list]]:
    """Up to n_pairs distinct A/A splits of 2k launches of the pool (every split when there are few)."""
    n = len(pool)
    if n < 2 * k:
        return []
    splits = []
    for chosen in itertools.combinations(range(n), 2 * k):
        for a in itertools.combinations(chosen[1:], k - 1):  # chosen[0] always on side A: no mirrored pairs
            side_a = (chosen[0], *a)
            splits.append((side_a, tuple(i for i in chosen if i not in side_a)))
            if len(splits) > 20 * n_pairs:
                break
    pick = rng.permutation(len(splits))[:n_pairs]
    return [([pool[i] for i in splits[j][0]], [pool[i] for i in splits[j][1]]) for j in pick]


def false_calls(pool: list, k: int, n_pairs: int, rng: np.random.Generator, slo: SLO) -> tuple[int, int, int]:
    """(pairs, comparisons, false better/worse) over up to n_pairs A/A splits of k launches a side."""
    pairs = draws(pool, k, n_pairs, rng)
    calls = [v for a, b in pairs for v in verdicts(a, b, slo).values()]
    return len(pairs), len(calls), sum(v in ("better", "worse") for v in calls)


def verdicts(a: list, b: list, slo: SLO) -> dict[str, str]:
    ta, tb = compare.TrialData("A", "A", a), compare.TrialData("B", "B", b)
    out = {}
    for metric, higher in compare.METRICS.items():
        iv = compare.difference(ta, tb, slo, metric)
        out[metric] = stats.verdict(iv, higher, iv.excludes_zero)
    return out


def fresh(n: int, db: str) -> Path:
    """Measure the A/A chapter: two trials of one configuration, n launches each, interleaved."""
    path = Path(tempfile.mkdtemp(prefix="aa-fresh-")) / "aa-bench.yaml"
    path.write_text(FRESH_YAML.format(repeats=n))
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "qwen3lab.cli", "run", str(path), "--db", db,
                    "--runs-dir", str(path.parent / "runs")], cwd=ROOT, check=True)
    print(f"fresh: {2 * n} launches in {time.monotonic() - t0:.0f} s into {db}")
    return Path(db)


def main(argv=None) -> int:
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    slo = NO_SLO
    tmp = tempfile.TemporaryDirectory(prefix="aa-bench-")
    dbs = committed(Path(tmp.name)) + [Path(d) for d in args.db]
    measured = None
    if args.fresh:
        dbs.append(fresh(args.fresh, args.fresh_db))
        store = Store(args.fresh_db)
        a, b = compare.trials_of(compare.chapter_trials(store, "aa-bench", "aa"))
        measured = {"a_launches": len(a.launches), "b_launches": len(b.launches), "verdicts": verdicts(a.launches, b.launches, slo)}
    rows, per_pool = [], []
    for db in dbs:
        for name, pool in pools(db):
            for k in SIDES:
                pairs, comparisons, false = false_calls(pool, k, args.pairs, rng, slo)
                if pairs:
                    per_pool.append({"pool": name, "launches_in_pool": len(pool), "per_side": k, "pairs": pairs,
                                     "comparisons": comparisons, "false": false})
    largest = max((len(p) for db in dbs for _, p in pools(db)), default=0)
    print(f"A/A pairs from stored launches of one configuration (largest pool: {largest} launches)")
    print(f"{'launches a side':>15} {'pools':>6} {'pairs':>7} {'comparisons':>12} {'false better/worse':>19} {'rate':>7}  target")
    for k in SIDES:
        mine = [p for p in per_pool if p["per_side"] == k]
        n, f = sum(p["comparisons"] for p in mine), sum(p["false"] for p in mine)
        rate = f / n if n else float("nan")
        ok = "no pool holds " + str(2 * k) + " launches" if not n else ("ok" if rate <= TARGET else "MISSED")
        rows.append({"per_side": k, "pools": len(mine), "pairs": sum(p["pairs"] for p in mine), "comparisons": n,
                     "false": f, "rate": rate, "target": TARGET})
        print(f"{k:>15} {len(mine):>6} {rows[-1]['pairs']:>7} {n:>12} {f:>19} {rate:>7.1%}  <= {TARGET:.0%}: {ok}")
    if measured:
        print(f"measured A/A chapter ({measured['a_launches']} + {measured['b_launches']} launches): {measured['verdicts']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows, "pools": per_pool, "measured_chapter": measured},
                              indent=2, default=str))
    print(f"wrote {out}")
    return 0 if all(r["rate"] <= TARGET for r in rows if r["comparisons"]) else 1


if __name__ == "__main__":
    sys.exit(main())
