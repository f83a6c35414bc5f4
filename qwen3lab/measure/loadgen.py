"""The async streaming client: one timing record per request, with `vllm bench serve`'s timing rules.

A chunk counts when it carries choices (its text may be empty); TTFT is the first such chunk, E2EL the last,
exactly as vLLM's own benchmark client times them. The client stays light on purpose: on a small machine it
shares the CPU with the server it measures, so the HTTP stream is parsed in an asyncio Protocol where the
bytes arrive (no reader task, no per-token coroutine switch), chunks are recognised by bytes, and only the
closing usage chunk is parsed as JSON. Every request's bytes are made before the load, the garbage collector's
heap is frozen during it, and `on_done` must stay O(1) (an append): storing, telemetry and progress happen
elsewhere (measure/runner.py, measure/telemetry.py).

Lines: over 450 because the client's one concept includes its own HTTP/1.1 reading (status, chunks,
SSE, kept-alive connections): a library's would cost CPU per token on the loop that timestamps the streams.
"""
from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ssl
import urllib.parse

from qwen3lab.analysis import metrics
from qwen3lab.experiment.spec import Workload
from qwen3lab.measure.workload import Request
from qwen3lab.traffic import replay

_EMPTY_CHOICES = (b'"choices":[]', b'"choices": []')  # tested one by one: no generator per token
_ROUTE = b"x-qwen3lab-route:"  # qwen3lab.measure.router.ROUTE_HEADER, as the header line starts


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
    route: str | None = None  # the server that answered, behind `qwen3lab router` (its x-qwen3lab-route header)
    session: str | None = None  # a traffic file's conversation and turn (qwen3lab.traffic.conversations)
    turn: int | None = None
    texts: list[bytes] | None = None  # the token chunks, kept only where the reply is needed (history: generated)

    @property
    def ok(self) -> bool:
        return bool(metrics.succeeded(self.error, self.ttft))


@dataclass
class LoadResult:
    records: list[RequestRecord]
    started_at: float  # wall clock (time.time) when the measured load began
    duration_s: float  # first measured send to the end of the load, failures included (vllm bench's duration)
    client_cpu_s: float  # CPU seconds this process spent during the measured load
    t0_perf: float  # time.perf_counter() when the measured load began: the origin of every `sent_at`
    loop_lag_s: list[float] = field(default_factory=list)  # how late each LAG_PROBE_S wake-up of the loop came
    stalled: str | None = None  # why the load was cut: the server is up but sent nothing for stall_timeout_s
    connections: int = 0  # TCP connections opened, warm-up included (kept alive: about the concurrency)


LAG_PROBE_S = 0.02


async def _watch_stalls(flights: list, stall_s: float, stalled: list[str]) -> None:
    """A server that is up but sends nothing (hung) would hold every request for its whole request_timeout_s:
    once no request in flight has had a byte for `stall_s`, each is failed and cancelled, and sending stops.

    flights: (task, record, t0) of every request created; a record's times are relative to its t0."""
    while True:
        await asyncio.sleep(min(1.0, stall_s / 4))
        now = time.perf_counter()
        flights[:] = [f for f in flights if not f[0].done()]  # a long (soak) load would rescan every request
        live = [(task, rec, t0) for task, rec, t0 in flights if rec.sent_at is not None]
        quiet = [now - (t0 + rec.sent_at + (rec.chunk_times[-1] if rec.chunk_times else 0.0)) for _, rec, t0 in live]
        if live and min(quiet) > stall_s:
            stalled.append(f"hung: no token for {stall_s:g} s with {len(live)} requests in flight "
                           f"(workload.stall_timeout_s); sending stopped")
            for task, rec, _ in live:
                rec.error = f"no token for {stall_s:g} s: the server hung"
                task.cancel()
            return


async def _probe_loop_lag(lags: list[float]) -> None:
    """How late the loop wakes: a stalled client (its own work, or no CPU for it) delays every timestamp taken
    meanwhile, so each run stores what its client's stalls were, beside the figures they would skew."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(LAG_PROBE_S)
        lags.append(max(0.0, time.perf_counter() - t - LAG_PROBE_S))  # libuv's ms timers may wake a hair early


def _payload(api: str, model: str, req: Request, workload: Workload) -> dict:
    body: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                  "temperature": workload.temperature}
    if workload.ignore_eos:
        body["ignore_eos"] = True
    if api == "chat":
        body["messages"] = list(getattr(req, "messages", ())) or [{"role": "user", "content": req.prompt}]
        body["max_completion_tokens"] = req.output_tokens
        if workload.enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": workload.enable_thinking}
    else:
        body["prompt"] = req.prompt
        body["max_tokens"] = req.output_tokens
    return body


def run_sync(coro):
    """Run a coroutine to completion on a fresh loop: uvloop when installed (vLLM depends on it; less client
    CPU per read), and in a thread of its own when this thread already runs a loop (a Jupyter kernel)."""
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None

    box: dict = {}

    async def main():
        box["task"], box["loop"] = asyncio.current_task(), asyncio.get_running_loop()
        return await coro

    def go():
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main())

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return go()
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qwen3lab-load")
    try:
        return pool.submit(go).result()
    except BaseException:
        # Ctrl-C / a kernel interrupt in the caller's thread: cancel the load there instead of waiting it out.
        if "task" in box:
            box["loop"].call_soon_threadsafe(box["task"].cancel)
        raise
    finally:
        pool.shutdown(wait=True)


class _StreamProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection, kept alive from one response to the next as vllm bench's aiohttp session does.

    Each response is parsed where its bytes arrive (no reader task, no copies per token): the status line and
    headers, chunked transfer encoding undone, the body cut into SSE events, each handed to `on_event` with
    the time of the read that completed it. `done` resolves when the response ends (its last chunk, its
    Content-Length, or the connection closing); `reusable` says whether the next request may use the connection.
    """

    def __init__(self, on_event: Callable[[bytes, float], None] | None = None):
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.start(on_event or (lambda msg, now: None))

    def start(self, on_event: Callable[[bytes, float], None]) -> None:
        """Ready for the next response on this connection."""
        self.on_event = on_event
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        self.status: int | None = None
        self.head = b""
        self.chunked = False
        self.length: int | None = None  # Content-Length, when the body is not chunked
        self.keep = True  # the server did not say `Connection: close`
        self.raw = b""  # body bytes not yet de-chunked
        self.need = 0  # bytes left in the current HTTP chunk
        self.last = False  # the last (zero-size) chunk has been read
        self.sse = b""  # de-chunked bytes not yet cut into events
        self.body = b""  # kept only for error responses
        self.seen = 0  # body bytes of a Content-Length response
        self.route: str | None = None
        self.reusable = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.done.done():
            return  # nothing is asked on this connection now
        if self.status is None:
            self.head += data
            cut = self.head.find(b"\r\n\r\n")
            if cut < 0:
                return
            head, data = self.head[:cut], self.head[cut + 4:]
            lines = head.split(b"\r\n")
            self.status = int(lines[0].split(b" ", 2)[1])
            for h in lines[1:]:
                low = h.lower()
                if low.startswith(b"transfer-encoding:") and b"chunked" in low:
                    self.chunked = True
                elif low.startswith(b"content-length:"):
                    self.length = int(h.split(b":", 1)[1])
                elif low.startswith(b"connection:") and b"close" in low:
                    self.keep = False
                elif low.startswith(_ROUTE):
                    self.route = h[len(_ROUTE):].strip().decode()
            self.keep = self.keep and lines[0].startswith(b"HTTP/1.1")
        if self.status != 200:
            self.body += self._dechunk(data) if self.chunked else data
            self._end_if_complete(len(data))
            return
        if self.chunked and not self.raw and not self.need and not self.sse:
            # vLLM writes each SSE event as one HTTP chunk and a read most often holds exactly one: handed
            # over with one slice, not cut three times (the client's CPU per token is what this saves)
            eol = data.find(b"\r\n")
            if 0 < eol < 9 and data.endswith(b"\n\n\r\n"):
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = -1  # a chunk extension: the general path below
                if size == len(data) - eol - 4 and data.find(b"\n\n", eol + 2) == len(data) - 4:
                    self.on_event(data[eol + 2:-4], now)
                    return
        self._feed(self._dechunk(data) if self.chunked else data, now)
        self._end_if_complete(len(data))

    def _end_if_complete(self, n_body: int) -> None:
        self.seen += n_body
        if self.last or (not self.chunked and self.length is not None and self.seen >= self.length):
            self.reusable = self.keep and not self.closed
            if not self.done.done():
                self.done.set_result(None)

    def _dechunk(self, data: bytes) -> bytes:
        self.raw += data
        out = []
        raw, pos = self.raw, 0
        while pos < len(raw):
            if self.need:
                take = raw[pos:pos + self.need]
                out.append(take)
                self.need -= len(take)
                pos += len(take)
                continue
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            line = raw[pos:eol]
            if not line:  # the CRLF that ends a chunk's data
                pos = eol + 2
                continue
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:  # the last chunk: the response ends at the empty line after any trailers
                rest = raw[eol + 2:]
                if rest.startswith(b"\r\n") or b"\r\n\r\n" in rest:
                    self.last, pos = True, len(raw)
                break  # else read again from this line once the rest has come
            self.need = size
            pos = eol + 2
        self.raw = raw[pos:]
        return b"".join(out)

    def _feed(self, data: bytes, now: float) -> None:
        buf = self.sse + data
        start = 0
        while (cut := buf.find(b"\n\n", start)) >= 0:
            self.on_event(buf[start:cut], now)
            start = cut + 2
        self.sse = buf[start:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed, self.reusable = True, False
        if not self.done.done():
            self.done.set_result(exc)


class _Connections:
    """Keep-alive connections to one server, as vllm bench's aiohttp connector keeps them: a request goes out
    on an idle connection when there is one, so the server's loop is not asked to accept a connection per
    request while it streams the others (and the client does not pay a connect per request either)."""

    def __init__(self, host: str, port: int, ssl_ctx):
        self.host, self.port, self.ssl_ctx = host, port, ssl_ctx
        self.idle: list[_StreamProtocol] = []
        self.opened = 0

    async def get(self, timeout_s: float) -> tuple[_StreamProtocol, bool]:
        """A connection, and whether it served a request before."""
        while self.idle:
            conn = self.idle.pop()  # the most recently used: the least likely to have been closed by the server
            if not conn.closed:
                return conn, True
        _, conn = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
            _StreamProtocol, self.host, self.port, ssl=self.ssl_ctx,
            server_hostname=self.host if self.ssl_ctx else None), timeout=timeout_s)
        self.opened += 1
        return conn, False

    def put(self, conn: _StreamProtocol) -> None:
        """Back to the idle ones when its response ended cleanly; closed otherwise (cut, timed out, cancelled)."""
        if conn.reusable and not conn.closed:
            self.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.transport.close()
        self.idle.clear()


def _judge(rec: RequestRecord, conn: _StreamProtocol, exc: BaseException | None, ended: bool) -> None:
    """A finished response's status, route, error (the first that applies) and TTFT/E2EL into its record."""
    chunks = rec.chunk_times
    rec.status, rec.route = conn.status, conn.route
    if conn.status is None:
        rec.error = f"connection closed before a response ({exc or 'no error'})"
    elif conn.status != 200:
        rec.error = f"HTTP {conn.status}: {conn.body[:500].decode(errors='replace')}"
    elif exc is not None and rec.error is None:
        rec.error = f"{type(exc).__name__}: {exc}"[:500]
    elif not ended and rec.error is None:
        rec.error = f"stream cut before [DONE] after {len(chunks)} chunks (connection closed)"
    if chunks:
        rec.ttft, rec.e2el = chunks[0], chunks[-1]
    elif rec.error is None:
        rec.error = "stream ended without a token chunk"


async def _one(conns: _Connections, head: bytes, body: bytes, rec: RequestRecord, t0: float,
               timeout_s: float) -> None:
    """Send one request and time its stream, with vllm bench serve's rules (see the module docstring)."""
    chunks, texts = rec.chunk_times, rec.texts
    st = time.perf_counter()
    ended = []  # vLLM ends every stream with `data: [DONE]`: a stream closed without it was cut

    def on_event(msg: bytes, now: float) -> None:
        if not msg.startswith(b"data:"):
            return  # SSE comments and keep-alives
        payload = msg[5:].strip()
        if payload == b"[DONE]":
            ended.append(now)
            return
        if b'"choices"' in payload and _EMPTY_CHOICES[0] not in payload and _EMPTY_CHOICES[1] not in payload:
            chunks.append(now - st)
            if texts is not None:
                texts.append(payload)
            return
        doc = json.loads(payload)
        if usage := doc.get("usage"):
            rec.prompt_tokens = usage.get("prompt_tokens")
            rec.output_tokens = usage.get("completion_tokens")
        elif err := doc.get("error"):
            rec.error = f"server error: {str(err)[:500]}"

    rec.sent_at = st - t0
    conn = None
    try:
        for _attempt in range(2):
            conn, reused = await conns.get(timeout_s)
            conn.start(on_event)
            conn.transport.write(head + body)
            exc = await asyncio.wait_for(conn.done, timeout=max(0.001, timeout_s - (time.perf_counter() - st)))
            if not (reused and conn.closed and not conn.head):
                break
            # an idle connection the server closed as this request went out: once more, on a new connection
        _judge(rec, conn, exc, bool(ended))
    except asyncio.CancelledError:
        rec.error = rec.error or "cancelled"
        raise
    except asyncio.TimeoutError:
        rec.error = f"timed out after {timeout_s:.0f} s"
        if chunks:
            rec.ttft = chunks[0]
    except Exception as exc:  # connection refused, reset: the record says which
        rec.error = f"{type(exc).__name__}: {exc}"[:500]
        if chunks:
            rec.ttft = chunks[0]
    finally:
        if conn is not None:
            conns.put(conn)


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
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    ssl_ctx = ssl.create_default_context() if parsed.scheme == "https" else None
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    prefix = (f"POST {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nContent-Type: application/json\r\n"
              f"Accept: text/event-stream\r\n{extra}")
    records: list[RequestRecord] = []

    # Every request's bytes are made before the first send: nothing is serialised on the loop that reads streams.
    wire: dict[int, tuple[bytes, bytes]] = {}
    for req in requests:
        body = json.dumps(_payload(api, model, req, workload)).encode()
        wire[id(req)] = ((prefix + f"Content-Length: {len(body)}\r\n\r\n").encode(), body)

    async def limited(req: Request, rec: RequestRecord, t0: float, held: bool = False):
        head, body = wire[id(req)]
        try:
            if sem is None or held:
                await _one(conns, head, body, rec, t0, workload.request_timeout_s)
            else:  # scheduled arrival: wait here for a slot, as vllm bench's max_concurrency does
                async with sem:
                    await _one(conns, head, body, rec, t0, workload.request_timeout_s)
        except asyncio.CancelledError:
            if stalled and on_done:  # failed by the stall watch: stored like any failed request
                on_done(rec)
            raise
        finally:
            if rec.status is None and rec.error and not rec.chunk_times:
                unanswered.set()  # no HTTP response at all: refused, reset, or a server going away
            if held:
                sem.release()
        if on_done:
            on_done(rec)

    def record_for(req: Request, warm: bool) -> RequestRecord:
        return RequestRecord(req.index, req.request_class, req.prompt_tokens, req.output_tokens,
                             req.shared_prefix, warm)

    conns = _Connections(host, port, ssl_ctx)
    stalled: list[str] = []
    unanswered = asyncio.Event()
    flights: list = []  # (task, record, t0) for the stall watch
    watch = asyncio.create_task(_watch_stalls(flights, workload.stall_timeout_s, stalled))
    tasks: list = []
    probe = None
    try:
        t0 = time.perf_counter()
        if n_warm:
            warm = [record_for(r, True) for r in requests[:n_warm]]
            records += warm
            warm_tasks = [asyncio.create_task(limited(r, rec, t0)) for r, rec in zip(requests, warm)]
            flights += [(task, rec, t0) for task, rec in zip(warm_tasks, warm)]
            _raise_first(await asyncio.gather(*warm_tasks, return_exceptions=True))
        measured = requests[n_warm:]
        offsets = replay.offsets(workload, measured)
        lap_s = None if offsets is None else replay.lap_s(workload, offsets)
        deadline = workload.duration_s
        # As vLLM's own client does: what exists now (imports, prompts, the tokenizer) moves out of the collector's
        # reach, so that no full collection walks it (tens of ms, a stalled read) while streams are timed.
        gc.collect()
        gc.freeze()
        cpu0, t0, started = time.process_time(), time.perf_counter(), time.time()
        lags: list[float] = []
        probe = asyncio.create_task(_probe_loop_lag(lags))
        # Closed loop (no arrival schedule): take a slot before creating the request, so that nothing is
        # queued past a deadline and sending stops at once when the server is gone.
        closed = offsets is None and sem is not None
        i = 0
        while deadline is not None or i < len(measured):
            req = measured[i % len(measured)]
            if offsets is not None:
                # Soak runs cycle the mix; their arrival times keep the same average gap.
                lap, pos = divmod(i, len(measured))
                target = offsets[pos] + lap * lap_s
                delay = target - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
            elif closed:
                await sem.acquire()
            if unanswered.is_set() and should_stop and not stalled:
                await _settle(should_stop)
                unanswered.clear()
            if stalled or (deadline is not None and time.perf_counter() - t0 >= deadline) or \
                    (should_stop and should_stop()):
                if closed:
                    sem.release()
                break  # time is up, the server is gone or hung: stop sending, keep what finished
            rec = record_for(req, False)
            if deadline is not None:
                rec.index = n_warm + i
            records.append(rec)
            tasks.append(asyncio.create_task(limited(req, rec, t0, held=closed)))
            flights.append((tasks[-1], rec, t0))
            i += 1
        _raise_first(await asyncio.gather(*tasks, return_exceptions=True))  # the stall watch cancels some
    finally:
        for task in tasks + [probe, watch]:
            if task is not None:
                task.cancel()
        conns.close()
        gc.unfreeze()
    # vllm bench's duration: to the end of the load, so a request that failed or timed out still takes its time
    duration = time.perf_counter() - t0
    return LoadResult(records, started, duration, time.process_time() - cpu0, t0, lags,
                      stalled[0] if stalled else None, conns.opened)


async def _settle(should_stop: Callable[[], bool], grace_s: float = 2.0) -> None:
    """A request got no response: before sending more, give a dying server the time to show it is gone. A
    SIGKILLed vLLM refuses connections a moment before its process can be reaped, and a closed loop sent
    hundreds of requests into that moment, each stored as a failure."""
    end = time.perf_counter() + grace_s
    while time.perf_counter() < end and not should_stop():
        await asyncio.sleep(0.05)


def _raise_first(outcomes: list) -> None:
    """gather(return_exceptions=True)'s results: a cancelled request is expected, any other error is raised."""
    for got in outcomes:
        if isinstance(got, Exception):
            raise got
