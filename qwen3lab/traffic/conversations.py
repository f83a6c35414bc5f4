"""Multi-turn sessions on the wire: each next turn carries the history so far, after its think time.

Sessions run concurrently (`workload.concurrency` at a time, or started at `source.session_rate` or at their
trace times); within a session a turn is sent once the previous one ended and its think time passed. With
`history: recorded` every body is made before the load (the recorded replies are known); with `generated`
the server's own reply is collected from its stream and the next turn's body is made when it is sent.
A failed turn ends its session: the turns after it would carry a history the server never gave.
"""
from __future__ import annotations

import asyncio
import gc
import json
import ssl
import time
import urllib.parse

from qwen3lab.measure import loadgen
from qwen3lab.traffic.replay import session_starts


def reply_text(payloads: list[bytes]) -> str:
    """The generated text of a stream's chunks (completions `text`, chat `delta.content`)."""
    out = []
    for p in payloads:
        for c in json.loads(p).get("choices") or []:
            out.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
    return "".join(out)


def _body(api: str, model: str, req, workload, history: list[dict] | None) -> dict:
    """The turn's request; `history` (generated replies) replaces the recorded one."""
    body = loadgen._payload(api, model, req, workload)
    if history is not None:
        messages = history + [{"role": "user", "content": req.user}]
        if api == "chat":
            body["messages"] = messages
        else:
            body["prompt"] = "".join(m["content"] for m in messages)
    return body


async def run_sessions(base_url: str, model: str, requests: list, workload, on_done=None,
                       headers: dict[str, str] | None = None, should_stop=None) -> loadgen.LoadResult:
    api, generated = workload.api, workload.source.history == "generated"
    url = base_url.rstrip("/") + ("/v1/chat/completions" if api == "chat" else "/v1/completions")
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    conns = loadgen._Connections(host, port, ssl.create_default_context() if parsed.scheme == "https" else None)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    prefix = (f"POST {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nContent-Type: application/json\r\n"
              f"Accept: text/event-stream\r\n{extra}")

    def wire(body: dict) -> tuple[bytes, bytes]:
        raw = json.dumps(body).encode()
        return (prefix + f"Content-Length: {len(raw)}\r\n\r\n").encode(), raw

    sessions: dict = {}
    for r in requests:
        sessions.setdefault(r.session, []).append(r)
    turns = list(sessions.values())
    made = {} if generated else {id(r): wire(_body(api, model, r, workload, None)) for r in requests}
    starts = session_starts(workload, turns)
    sem = asyncio.Semaphore(workload.concurrency) if starts is None and workload.concurrency else None
    records: list[loadgen.RequestRecord] = []

    async def session(reqs: list, start: float | None) -> None:
        if start is not None:
            await asyncio.sleep(max(0.0, start - (time.perf_counter() - t0)))
        history = None
        for k, req in enumerate(reqs):
            if k and req.think_s:
                await asyncio.sleep(req.think_s)
            if should_stop and should_stop():
                return
            rec = loadgen.RequestRecord(req.index, req.request_class, req.prompt_tokens, req.output_tokens,
                                        req.shared_prefix, False, session=req.session, turn=req.turn)
            if generated:
                rec.texts = []
                head, body = wire(_body(api, model, req, workload, history))
            else:
                head, body = made[id(req)]
            records.append(rec)
            await loadgen._one(conns, head, body, rec, t0, workload.request_timeout_s)
            if on_done:
                on_done(rec)
            if not rec.ok:
                return
            if generated:
                base = history if history is not None else list(req.messages[:-1])
                history = base + [{"role": "user", "content": req.user},
                                  {"role": "assistant", "content": reply_text(rec.texts)}]
                rec.texts = None

    async def held(reqs: list) -> None:
        async with sem:
            await session(reqs, None)

    gc.collect()
    gc.freeze()
    lags: list[float] = []
    cpu0, t0, started = time.process_time(), time.perf_counter(), time.time()
    probe = asyncio.create_task(loadgen._probe_loop_lag(lags))
    tasks = [asyncio.create_task(held(s) if sem else session(s, None if starts is None else float(starts[i])))
             for i, s in enumerate(turns)]
    try:
        loadgen._raise_first(await asyncio.gather(*tasks, return_exceptions=True))
    finally:
        for task in tasks + [probe]:
            task.cancel()
        conns.close()
        gc.unfreeze()
    records.sort(key=lambda r: r.index)
    return loadgen.LoadResult(records, started, time.perf_counter() - t0, time.process_time() - cpu0, t0, lags,
                              None, conns.opened)
