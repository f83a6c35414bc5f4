"""Results of other benchmark tools as qwen3lab runs, so they compare beside qwen3lab's own.

Two formats, told apart by their keys:
- `vllm bench serve --save-result` JSON (`--append-result` files hold one JSON object a line). With
  `--save-detailed` it has per-request lists: input_lens, output_lens, ttfts, itls (gaps between chunks after
  the first), latencies, start_times (perf_counter seconds), errors ("" = success). Those become request rows:
  TTFT = ttfts[i], E2EL = latencies[i], chunk times = TTFT + running sum of itls, so TPOT, ITL and goodput
  are recomputed with the same rules as qwen3lab's own runs. Without --save-detailed only the summary is kept.
- GuideLLM benchmark JSON (`guidellm run --output kind=json`, report schema version 2, as written by
  guidellm 0.8): one run per entry of `benchmarks`, with rows from `requests.successful/errored/incomplete`:
  TTFT = time_to_first_token_ms, E2EL = last_token_iteration - request_start (to the last chunk, vLLM's
  convention; GuideLLM's own request_latency runs to the end of the HTTP response), prompt and output tokens as
  GuideLLM counted them. GuideLLM keeps only the first and last token times, so ITL is not recomputed for it.
  When its --metrics sample_size dropped requests, the run says so: goodput from its rows would undercount.

Imported runs have engine_kind `import` and their provenance (tool, version, file, sha256) in info_json.
Importing the same file again adds nothing.
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from qwen3lab.errors import Qwen3LabError
from qwen3lab.analysis import selection
from qwen3lab.analysis.metrics import RequestTable, summarize
from qwen3lab.store import Store

EXPERIMENT = "imported"
CLASS = "all"  # neither tool records a request class


class ImportFileError(Qwen3LabError):
    pass


def load_records(path: Path) -> list[dict]:
    """The JSON objects of a file: one, or one a line (vllm bench serve --append-result)."""
    text = path.read_text()
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ImportFileError(f"{path}: not JSON ({exc}). Fix: pass the file written by `vllm bench serve "
                               "--save-result` or by GuideLLM's --output kind=json") from exc


def detect(record: dict) -> str:
    if isinstance(record.get("benchmarks"), list) and "metadata" in record:
        return "guidellm"
    if "request_throughput" in record and "duration" in record and "completed" in record:
        return "vllm-bench-serve"
    raise ImportFileError(f"unknown result format (keys: {', '.join(list(record)[:12])}). Supported: vllm bench serve "
                       "--save-result JSON, GuideLLM benchmark JSON (report version 2)")


def import_files(store: Store, paths: list[str | Path], experiment: str = EXPERIMENT) -> list[str]:
    """Import every result in every file; returns the run ids (existing ones for files imported before)."""
    ids = []
    for p in paths:
        path = Path(p).expanduser().resolve()
        if not path.is_file():
            raise ImportFileError(f"no file {path}. Fix: pass paths of result JSON files")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        for i, record in enumerate(load_records(path)):
            kind = detect(record)
            runs = _vllm_bench(record) if kind == "vllm-bench-serve" else _guidellm(record)
            for j, run in enumerate(runs):
                key = f"import-{digest[:16]}-{i}-{j}"
                if done := selection.previous_run(store, key, retry_failed=True):  # a failed import is tried again
                    ids.append(done[0])
                    continue
                label = path.stem + (f"/{run['label']}" if run.get("label") else "") + (f"#{i}" if i else "")
                ids.append(_store(store, run, key, experiment, kind, label, path, digest, i))
    return ids


# --- vllm bench serve -----------------------------------------------------------------------------------
_VLLM_SUMMARY = ("completed", "failed", "duration", "request_throughput", "output_throughput",
                 "total_token_throughput", "request_goodput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
                 "median_tpot_ms", "p95_tpot_ms", "median_itl_ms", "p99_e2el_ms", "mean_ttft_ms", "mean_tpot_ms",
                 "mean_itl_ms", "mean_e2el_ms", "median_e2el_ms", "total_input_tokens", "total_output_tokens")


def _vllm_bench(r: dict) -> list[dict]:
    rows = []
    if r.get("ttfts") is not None and r.get("start_times") is not None:
        t0 = min(r["start_times"]) if r["start_times"] else 0.0
        latencies = r.get("latencies") or [None] * len(r["ttfts"])
        errors = r.get("errors") or [""] * len(r["ttfts"])
        for i, (ttft, itl, start, lat, err) in enumerate(zip(r["ttfts"], r["itls"], r["start_times"], latencies, errors)):
            ok = not err
            chunks = list(ttft + np.cumsum([0.0, *itl])) if ok else []
            rows.append({
                "idx": i, "request_class": CLASS, "warmup": False, "shared_prefix": False,
                "prompt_tokens": r["input_lens"][i], "output_tokens": r["output_lens"][i] if ok else None,
                "sent_at": start - t0, "ttft": ttft if ok else None,
                "e2el": (lat if lat is not None else chunks[-1]) if ok else None,
                "chunk_times": chunks, "status": 200 if ok else None, "error": err or None,
            })
    source = {k: r.get(k) for k in _VLLM_SUMMARY if r.get(k) is not None}
    started = _vllm_date(r.get("date"))
    return [{
        "rows": rows, "duration": float(r["duration"]), "source_summary": source, "model": r.get("model_id"),
        "started_at": started, "tool_version": None,
        "settings": {k: r.get(k) for k in ("backend", "label", "tokenizer_id", "num_prompts", "request_rate",
                                            "burstiness", "max_concurrency") if k in r},
        "note": None if rows else "summary only (saved without --save-detailed): no per-request rows to "
                                  "recompute goodput under other SLOs",
    }]


def _vllm_date(date: str | None) -> datetime | None:
    try:  # vllm writes local time without a zone
        return datetime.strptime(date, "%Y%m%d-%H%M%S").astimezone(timezone.utc) if date else None
    except ValueError:
        return None


# --- GuideLLM ---------------------------------------------------------------------------------------------
def _guidellm(report: dict) -> list[dict]:
    meta = report.get("metadata") or {}
    if meta.get("version") not in (None, 2):
        raise ImportFileError(f"GuideLLM report schema version {meta.get('version')}: this importer reads version 2 "
                           "(guidellm 0.8). Fix: re-save the report with that guidellm, or open an issue")
    out = []
    for b in report["benchmarks"]:
        sched = b.get("scheduler_metrics") or {}
        t0 = sched.get("measure_start_time") or b.get("start_time") or 0.0
        reqs = b.get("requests") or {}
        rows = []
        for group in ("successful", "errored", "incomplete"):
            for q in reqs.get(group) or []:
                rows.append(_guidellm_row(q, group, t0))
        rows.sort(key=lambda row: row["sent_at"])
        for i, row in enumerate(rows):
            row["idx"] = i
        totals = (b.get("metrics") or {}).get("request_totals") or {}
        made = sum(int(totals.get(k) or 0) for k in ("successful", "errored", "incomplete"))
        note = None
        if made and len(rows) < made:
            note = (f"GuideLLM kept {len(rows)} of {made} requests (--metrics sample_size): throughput and goodput "
                    "recomputed from these rows undercount")
        strategy = (b.get("config") or {}).get("strategy") or {}
        label = strategy.get("type_", "benchmark")
        for key in ("streams", "rate"):
            if strategy.get(key) is not None:
                label += f"@{strategy[key]:g}" if isinstance(strategy[key], (int, float)) else f"@{strategy[key]}"
        backend = (b.get("config") or {}).get("backend") or {}
        out.append({
            "rows": rows, "duration": float(b.get("duration") or 0.0), "model": backend.get("model"),
            "started_at": datetime.fromtimestamp(t0, timezone.utc) if t0 else None, "label": label,
            "tool_version": meta.get("guidellm_version"), "note": note,
            "source_summary": _guidellm_summary(b.get("metrics") or {}),
            "settings": {"strategy": strategy, "target": backend.get("target"),
                         "request_format": backend.get("request_format")},
        })
    return out


def _guidellm_row(q: dict, group: str, t0: float) -> dict:
    timings = (q.get("info") or {}).get("timings") or {}
    start = q.get("request_start_time") or timings.get("request_start") or t0
    ok = group == "successful" and q.get("time_to_first_token_ms") is not None
    last = timings.get("last_token_iteration")
    e2el = (last - timings["request_start"]) if (last and timings.get("request_start")) else q.get("request_latency")
    ttft = q["time_to_first_token_ms"] / 1000 if ok else None
    error = None if ok else ((q.get("info") or {}).get("error") or f"GuideLLM request {group}")
    return {
        "idx": 0, "request_class": CLASS, "warmup": False, "shared_prefix": False,
        "prompt_tokens": q.get("prompt_tokens"), "output_tokens": q.get("output_tokens") if ok else None,
        "sent_at": start - t0, "ttft": ttft, "e2el": e2el if ok else None, "chunk_times": [],
        "status": 200 if ok else None, "error": str(error)[:500] if error else None,
    }


def _guidellm_summary(m: dict) -> dict:
    def stat(name: str, key: str):
        try:
            s = m[name]["successful"]
            return s[key] if key in ("mean", "median") else s["percentiles"][key]
        except (KeyError, TypeError):
            return None

    out = {"median_ttft_ms": stat("time_to_first_token_ms", "median"), "p95_ttft_ms": stat("time_to_first_token_ms", "p95"),
           "p99_ttft_ms": stat("time_to_first_token_ms", "p99"), "median_tpot_ms": stat("time_per_output_token_ms", "median"),
           "median_itl_ms": stat("inter_token_latency_ms", "median"),
           "request_throughput": stat("requests_per_second", "mean"),
           "output_throughput": stat("output_tokens_per_second", "mean")}
    return {k: v for k, v in out.items() if v is not None}


# --- into the store -------------------------------------------------------------------------------------
def _summary(run: dict) -> dict:
    rows = run["rows"]
    if not rows:
        summary = dict(run["source_summary"])
        summary.setdefault("duration", run["duration"])
        summary.pop("request_goodput", None)  # under the tool's own SLOs, unknown here; kept in info_json
        return summary
    table = RequestTable.from_columns(
        ok=[r["error"] is None and r["ttft"] is not None for r in rows], ttft=[r["ttft"] for r in rows],
        e2el=[r["e2el"] for r in rows], prompt_tokens=[r["prompt_tokens"] for r in rows],
        output_tokens=[r["output_tokens"] for r in rows], chunk_times=[r["chunk_times"] for r in rows],
        request_class=[r["request_class"] for r in rows])
    summary = summarize(table, run["duration"])
    if not any(len(r["chunk_times"]) > 1 for r in rows):
        for k in [k for k in summary if "_itl_" in k]:
            summary[k] = None  # no chunk times: ITL unknown, not zero
    return summary


def _store(store: Store, run: dict, key: str, experiment: str, tool: str, label: str, path: Path,
           digest: str, record: int) -> str:
    summary = _summary(run)
    provenance = {"tool": tool, "tool_version": run["tool_version"], "path": str(path), "sha256": digest,
                  "record": record, "settings": run["settings"], "source_summary": run["source_summary"]}
    status = "ok" if (summary.get("completed") or 0) > 0 else "failed"
    reason = run["note"] if status == "ok" else "no request completed in the imported result"
    started = run["started_at"] or datetime.now(timezone.utc)
    run_id = store.begin_run(
        trial_key=key, experiment=experiment, chapter=tool, trial=label, engine_kind="import", model=run["model"],
        started_at=started, info_json={"import": provenance}, tags_json={"tool": tool},
        launch_command=None, experiment_path=str(path), status="running",
    )
    store.add_requests(run_id, run["rows"])
    store.finish_run(run_id, status, reason, summary)
    if run["started_at"]:
        store.update_run(run_id, ended_at=_plus_seconds(started, run["duration"]))
    return run_id


def _plus_seconds(t: datetime, seconds: float) -> datetime:
    from datetime import timedelta

    return t + timedelta(seconds=seconds)
