"""The async streaming client: one timing record per request, with `vllm bench serve`'s timing rules.

A chunk counts when it carries choices (its text may be empty); TTFT is the first such chunk, E2EL the last,
exactly as vLLM's own benchmark client times them. The client stays light on purpose: on a small machine it
shares the CPU with the server it measures, so chunks are recognised by bytes and only the closing usage
chunk is parsed as JSON.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from .spec import Workload
from .workload import Request, arrival_offsets

_EMPTY_CHOICES = (b'"choices":[]', b'"choices": []')


@dataclass
class RequestRecord:
    index: int
    request_class: str
    prompt_tokens_target: int
    output_tokens_target: int
    shared_prefix: bool
    warmup: bool
    sent_at: float = 0.0  # seconds since the load started
    ttft: float | None = None
    e2el: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # seconds since this request was sent
    prompt_tokens: int | None = None  # from the server's usage
    output_tokens: int | None = None
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None


@dataclass
class LoadResult:
    records: list[RequestRecord]
    started_at: float  # wall clock (time.time) when the measured load began
    duration_s: float  # first measured send to last measured completion
    client_cpu_s: float  # CPU seconds this process spent during the measured load
    t0_perf: float  # time.perf_counter() when the measured load began: the origin of every `sent_at`


def _payload(api: str, model: str, req: Request, workload: Workload) -> dict:
    body: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                  "temperature": workload.temperature}
    if workload.ignore_eos:
        body["ignore_eos"] = True
    if api == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
        body["max_completion_tokens"] = req.output_tokens
        if workload.enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": workload.enable_thinking}
    else:
        body["prompt"] = req.prompt
        body["max_tokens"] = req.output_tokens
    return body


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, rec: RequestRecord, t0: float,
               timeout: aiohttp.ClientTimeout) -> None:
    st = time.perf_counter()
    rec.sent_at = st - t0
    chunks = rec.chunk_times
    try:
        async with session.post(url, data=body, timeout=timeout) as resp:
            rec.status = resp.status
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                return
            buf = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter() - st
                buf += data
                while (cut := buf.find(b"\n\n")) >= 0:
                    msg, buf = buf[:cut], buf[cut + 2:]
                    if not msg.startswith(b"data:"):
                        continue  # SSE comments and keep-alives
                    payload = msg[5:].strip()
                    if payload == b"[DONE]":
                        continue
                    if b'"choices"' in payload and not any(e in payload for e in _EMPTY_CHOICES):
                        chunks.append(now)
                        continue
                    doc = json.loads(payload)
                    if usage := doc.get("usage"):
                        rec.prompt_tokens = usage.get("prompt_tokens")
                        rec.output_tokens = usage.get("completion_tokens")
                    elif err := doc.get("error"):
                        rec.error = f"server error: {str(err)[:500]}"
            if chunks:
                rec.ttft, rec.e2el = chunks[0], chunks[-1]
            elif rec.error is None:
                rec.error = "stream ended without a token chunk"
    except asyncio.CancelledError:
        rec.error = rec.error or "cancelled"
        raise
    except Exception as exc:  # connection refused, reset, timeout: the record says which
        rec.error = f"{type(exc).__name__}: {exc}"[:500]
        if chunks:
            rec.ttft = chunks[0]


async def run_load(
    base_url: str,
    model: str,
    requests: list[Request],
    workload: Workload,
    on_done: Callable[[RequestRecord], None] | None = None,
    headers: dict[str, str] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> LoadResult:
    """Send `requests` (warmup first) and return every record. `on_done` sees each finished record."""
    api = workload.api
    url = base_url.rstrip("/") + ("/v1/chat/completions" if api == "chat" else "/v1/completions")
    n_warm = min(workload.warmup_requests, len(requests))
    conc = workload.concurrency
    sem = asyncio.Semaphore(conc) if conc else None
    timeout = aiohttp.ClientTimeout(total=workload.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=conc or 0, force_close=False)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    records: list[RequestRecord] = []

    async def limited(session, req: Request, rec: RequestRecord, t0: float, held: bool = False):
        body = json.dumps(_payload(api, model, req, workload)).encode()
        try:
            if sem is None or held:
                await _one(session, url, body, rec, t0, timeout)
            else:  # scheduled arrival: wait here for a slot, as vllm bench's max_concurrency does
                async with sem:
                    await _one(session, url, body, rec, t0, timeout)
        finally:
            if held:
                sem.release()
        if on_done:
            on_done(rec)

    def record_for(req: Request, warm: bool) -> RequestRecord:
        return RequestRecord(req.index, req.request_class, req.prompt_tokens, req.output_tokens,
                             req.shared_prefix, warm)

    async with aiohttp.ClientSession(connector=connector, headers=hdrs) as session:
        t0 = time.perf_counter()
        if n_warm:
            warm = [record_for(r, True) for r in requests[:n_warm]]
            records += warm
            await asyncio.gather(*(limited(session, r, rec, t0) for r, rec in zip(requests, warm)))
        measured = requests[n_warm:]
        offsets = arrival_offsets(workload, len(measured))
        deadline = workload.duration_s
        cpu0, t0, started = time.process_time(), time.perf_counter(), time.time()
        tasks = []
        # Closed loop (no arrival schedule): take a slot before creating the request, so that nothing is
        # queued past a deadline and sending stops at once when the server is gone.
        closed = offsets is None and sem is not None
        try:
            i = 0
            while deadline is not None or i < len(measured):
                req = measured[i % len(measured)]
                if offsets is not None:
                    # Soak runs cycle the mix; their arrival times keep the same average gap.
                    lap, pos = divmod(i, len(measured))
                    target = offsets[pos] + lap * (offsets[-1] + 1.0 / workload.request_rate)
                    delay = target - (time.perf_counter() - t0)
                    if delay > 0:
                        await asyncio.sleep(delay)
                elif closed:
                    await sem.acquire()
                if (deadline is not None and time.perf_counter() - t0 >= deadline) or (should_stop and should_stop()):
                    if closed:
                        sem.release()
                    break  # time is up, or the server is gone: stop sending, keep what finished
                rec = record_for(req, False)
                if deadline is not None:
                    rec.index = n_warm + i
                records.append(rec)
                tasks.append(asyncio.create_task(limited(session, req, rec, t0, held=closed)))
                i += 1
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        ends = [r.sent_at + r.e2el for r in records if not r.warmup and r.e2el is not None]
        duration = (max(ends) if ends else time.perf_counter() - t0)
        return LoadResult(records, started, duration, time.process_time() - cpu0, t0)
