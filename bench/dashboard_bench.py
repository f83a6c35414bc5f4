"""How fast the dashboard is on a big store: 1,000 runs and 1,000,000 request rows, written through the store API.

    python bench/dashboard_bench.py [--db /tmp/qwen3lab-dash-bench.duckdb] [--runs 1000] [--requests 1000000] [--rebuild]

Times the store queries the pages make, compare's ranking and winner, and whole page renders (Streamlit's
AppTest runs the page script as the server would, without a browser), each cold (caches cleared) and warm.
Target: every page under 1 s cold, the Compare page's opening group (48 runs) and the Claims page included. Prints a table; writes bench/results/*.json.
The rows are synthetic (drawn from distributions shaped like the tiny model's runs): this measures the
dashboard, not vLLM.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qwen3lab.analysis import compare  # noqa: E402
from qwen3lab.analysis.claims import claims as claims_of  # noqa: E402
from qwen3lab.experiment.spec import SLO, EngineConfig  # noqa: E402
from qwen3lab.store import Store  # noqa: E402

OUT_TOKENS = 32  # chunk times per request; the Compare page does not read them, the file still holds them
# Every page under 1 s cold (issue 33), the opening state (the largest comparable group) included
TARGETS = {name: 1.0 for name in ("page: Runs (cold)", "page: Compare 5 runs (cold)", "page: Compare, the opening group (cold)",
                                  "page: Winner 5 runs (cold)", "page: Export (cold)", "page: Claims of 1 experiment (cold)",
                                  "page: Capacity (cold)", "page: Drift (cold)")}


class _OneConnection(Store):
    """The store's own writes (begin_run, finish_run, add_samples) on one connection held for the whole build:
    opening and closing the file for each write (a checkpoint each time) would take most of the build."""

    def __init__(self, path):
        super().__init__(path)
        with super().connect():  # creates and migrates the file
            pass
        import duckdb

        self._con = duckdb.connect(self.path)

    @contextmanager
    def connect(self, read_only: bool = False):
        yield self._con

    def close(self) -> None:
        self._con.close()


def build(db: Path, n_runs: int, total_requests: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    per_run = -(-total_requests // sum(1 for i in range(n_runs) if i % 25))  # 1 run in 25 failed or skipped
    store = _OneConnection(db)
    t0 = time.perf_counter()
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    batch, batch_samples = [], []
    for i in range(n_runs):
        exp, chapter, trial = f"exp-{i // 50:02d}", f"chapter-{i // 10 % 5}", f"trial-{i % 10}"
        cfg = EngineConfig(model="builtin:qwen3-14b", max_num_seqs=int(2 ** (4 + i % 7)), gpu_memory_utilization=0.9)
        status = "ok" if i % 25 else ("failed" if i % 50 else "skipped")
        run_id = store.begin_run(
            run_id=f"bench-{i:05d}", trial_key=f"k{i}", experiment=exp, chapter=chapter, trial=trial,
            baseline="trial-0" if i % 10 else None, engine_kind="vllm", model=cfg.model,
            config_json=cfg.model_dump(mode="json"), config_hash=cfg.config_hash(), launch_command=cfg.to_shell(),
            slo_json={"ttft_p95_ms": 800, "tpot_p95_ms": 60}, gpu="1x NVIDIA H100 80GB HBM3", vllm_version="0.32.0",
            host="bench", started_at=start + timedelta(minutes=3 * i))
        if status != "ok":
            store.finish_run(run_id, status, "synthetic failure for the benchmark")
            continue
        speed = rng.uniform(0.5, 1.5)
        ttft = rng.gamma(4.0, 0.05 / speed, per_run)
        itl = rng.gamma(9.0, 0.002 / speed, (per_run, OUT_TOKENS - 1))
        chunks = np.concatenate([ttft[:, None], ttft[:, None] + np.cumsum(itl, axis=1)], axis=1)
        sent = np.sort(rng.uniform(0, per_run / 20 / speed, per_run))
        e2el = chunks[:, -1]
        batch.append((run_id, ttft, e2el, sent, chunks))
        duration = float((sent + e2el).max())
        batch_samples.append((run_id, [(float(t), "vllm", name, float(v)) for t in range(int(duration) + 1)
                                       for name, v in (("vllm:num_requests_running", rng.integers(0, 64)),
                                                       ("vllm:kv_cache_usage_perc", rng.uniform()))]))
        summary = {"completed": per_run, "failed": 0, "duration": duration, "output_throughput": per_run * OUT_TOKENS / duration,
                   "request_throughput": per_run / duration, "p95_ttft_ms": float(np.percentile(ttft, 95) * 1000),
                   "median_ttft_ms": float(np.median(ttft) * 1000), "p95_tpot_ms": float(np.percentile(itl.mean(1), 95) * 1000),
                   "p99_e2el_ms": float(np.percentile(e2el, 99) * 1000)}
        store.finish_run(run_id, "ok", None, summary)
        if sum(len(b[1]) for b in batch) >= 200_000:
            _write(store, batch, batch_samples)
            batch, batch_samples = [], []
        if i % 100 == 99:
            print(f"  {i + 1} runs written ({time.perf_counter() - t0:.0f} s)", flush=True)
    _write(store, batch, batch_samples)
    store.close()
    return time.perf_counter() - t0


def _write(store: Store, batch: list, batch_samples: list) -> None:
    """Request rows as Arrow columns into the store's own table (store.add_requests builds them row by row from
    records, which at 10,000,000 rows takes most of an hour on 2 cores), and the samples through the store API."""
    import pyarrow as pa

    from qwen3lab.store import REQUEST_COLUMNS, _request_schema

    if batch:
        n = [len(b[1]) for b in batch]
        total = sum(n)
        chunks = np.concatenate([b[4] for b in batch])
        idx = np.concatenate([np.arange(k) for k in n])
        cols = {
            "run_id": pa.array(np.repeat([b[0] for b in batch], n)), "idx": pa.array(idx, pa.int32()),
            "request_class": pa.array(np.array(["chat", "summary", "long_document"])[idx % 3]),
            "warmup": pa.array(np.zeros(total, bool)), "shared_prefix": pa.array(np.zeros(total, bool)),
            "prompt_tokens_target": pa.array(np.full(total, 512), pa.int32()),
            "output_tokens_target": pa.array(np.full(total, OUT_TOKENS), pa.int32()),
            "prompt_tokens": pa.array(np.full(total, 512), pa.int32()),
            "output_tokens": pa.array(np.full(total, OUT_TOKENS), pa.int32()),
            "sent_at": pa.array(np.concatenate([b[3] for b in batch])), "ttft": pa.array(np.concatenate([b[1] for b in batch])),
            "e2el": pa.array(np.concatenate([b[2] for b in batch])),
            "chunk_times": pa.ListArray.from_arrays(pa.array(np.arange(total + 1) * OUT_TOKENS, pa.int32()),
                                                    pa.array(chunks.ravel())),
            "status": pa.array(np.full(total, 200), pa.int32()), "error": pa.nulls(total, pa.string()),
            "route": pa.nulls(total, pa.string()),
        }
        table = pa.table([cols[c] for c in REQUEST_COLUMNS], schema=_request_schema())
        with store.connect() as con:
            con.register("incoming", table)
            con.execute(f"INSERT INTO requests SELECT {', '.join(REQUEST_COLUMNS)} FROM incoming")
    for rid, s in batch_samples:
        store.add_samples(rid, s)


def timed(fn, repeat: int = 5) -> dict:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "n": repeat}


def page_timed(db: Path, path: str, run_ids=None, cold=True, repeat=3) -> dict:
    """A page render alone: the app's first run (cache filling, navigation) is outside the timing."""
    from streamlit.testing.v1 import AppTest

    import streamlit as st

    times = []
    for _ in range(repeat):
        at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
        at.session_state["experiment"] = "exp-00"
        if run_ids:
            at.session_state["run_ids"] = run_ids
        at.run()
        if path != "views/compare.py":
            at.switch_page(path)
        if cold:
            st.cache_data.clear()
        t = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t)
        assert not at.exception, [e.value for e in at.exception]
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "n": repeat}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="/tmp/qwen3lab-dash-bench.duckdb")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=1_000_000, help="measured request rows in all")
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args()
    db = Path(args.db)
    build_s = None
    if args.rebuild or not db.exists():
        db.unlink(missing_ok=True)
        print(f"building {db}: {args.runs} runs, {args.requests:,} requests, through the store API")
        build_s = build(db, args.runs, args.requests)
    os.environ["QWEN3LAB_DB"] = str(db)
    store = Store(db)
    runs = store.runs()
    n_req = sum(store.request_counts(list(runs.run_id)).values())
    # five runs of the experiment the pages open on (runs of another are not offered there: the page would fall
    # back to the opening group and time that instead)
    five = list(runs[(runs.status == "ok") & (runs.experiment == "exp-00")].run_id[:5])
    slo = SLO(ttft_p95_ms=800, tpot_p95_ms=60)
    results = {
        "store.runs() (all runs)": timed(lambda: store.runs()),
        "store.runs(with_json) (all)": timed(lambda: store.runs(with_json=True), 3),
        "store.requests(5 runs, no chunks)": timed(lambda: store.requests(five, with_chunks=False)),
        "store.requests(5 runs, with chunks)": timed(lambda: store.requests(five)),
        "store.samples(5 runs)": timed(lambda: store.samples(five)),
        "compare.load_runs + pick_winner (5)": timed(lambda: compare.pick_winner(compare.load_runs(store, five), slo), 3),
        "claims (1 experiment, 48 runs)": timed(lambda: claims_of(store, "exp-00", slo), 1),
        "page: Runs (cold)": page_timed(db, "views/runs.py"),
        "page: Runs (warm)": page_timed(db, "views/runs.py", cold=False),
        "page: Compare 5 runs (cold)": page_timed(db, "views/compare.py", five),
        "page: Compare 5 runs (warm)": page_timed(db, "views/compare.py", five, cold=False),
        "page: Compare, the opening group (cold)": page_timed(db, "views/compare.py"),
        "page: Winner 5 runs (cold)": page_timed(db, "views/winner.py", five),
        "page: Export (cold)": page_timed(db, "views/export.py", five),
        "page: Claims of 1 experiment (cold)": page_timed(db, "views/claims.py"),
        "page: Capacity (cold)": page_timed(db, "views/capacity.py"),
        "page: Drift (cold)": page_timed(db, "views/drift.py"),
    }
    print(f"\n{len(runs)} runs, {n_req:,} measured request rows, {db.stat().st_size / 2**20:.0f} MiB"
          + (f", built in {build_s:.0f} s" if build_s else ""))
    print(f"{'what':44} {'median':>9} {'min':>9} {'max':>9}  target")
    for name, r in results.items():
        target = TARGETS.get(name)
        verdict = "" if target is None else (f"< {target:g} s " + ("ok" if r["median_s"] < target else "MISSED"))
        print(f"{name:44} {r['median_s']:8.3f}s {r['min_s']:8.3f}s {r['max_s']:8.3f}s  {verdict}")
    out = ROOT / "bench" / "results" / f"dashboard-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": len(runs), "request_rows": n_req, "db_mib": db.stat().st_size / 2**20,
                               "build_s": build_s, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                               "platform": platform.platform()},
                               "targets_s": TARGETS, "results": results}, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
