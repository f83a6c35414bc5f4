"""The length-aware router: one OpenAI-compatible address in front of a `short` and a `long` vLLM server.

Each completions or chat request goes to `short` when its prompt has at most `threshold_tokens` tokens, else
to `long` (or, for comparison, to each route in turn: `round-robin`). A prompt is counted with the served
model's tokenizer, as vLLM counts it (the chat template rendered for chat), unless its length alone decides:
a byte-level BPE token covers at least one byte, so a prompt of at most `threshold_tokens` bytes is short
without being tokenized (that encode was most of the router's own first-token time). The backend's response
bytes go back unchanged (SSE events as vLLM wrote them); only two headers are added: `x-qwen3lab-route`, so a
client can store which route served each request, and `x-qwen3lab-prompt-tokens`, the count, where counted.

Built on aiohttp, server and client: it is already a dependency, it is maintained by aio-libs with a long
record, one library gives both sides (a streaming server response and a pooled streaming client), and on
uvloop it adds well under a millisecond per request (bench/router_bench.py). Each backend gets its own bounded
connection pool with keep-alive, a connect timeout and a read timeout (the longest silence allowed before the
response starts and between two chunks); a backend that stays silent longer gets a 504 naming it, and a stream
that a backend breaks or leaves silent ends with an SSE error event naming the backend, never a hang.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from qwen3lab.errors import EngineError, SpecError
from qwen3lab.measure.prompt_tokens import PromptCounter

ROUTES = ("short", "long")
POLICIES = ("length", "round-robin")
ROUTE_HEADER = "x-qwen3lab-route"
TOKENS_HEADER = "x-qwen3lab-prompt-tokens"
_OFFLOAD_CHARS = 64 * 1024  # longer prompts are counted in a thread, so short requests are not held behind them
_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
        "proxy-authorization", "proxy-connection", "accept-encoding"}
_LATENCY_BUCKETS = (5e-5, 1e-4, 2e-4, 3e-4, 5e-4, 7.5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.5)


# --- configuration -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RouterConfig:
    routes: dict[str, str]  # name -> backend base URL
    threshold_tokens: int
    tokenizer: str | None = None  # None: the `root` folder the first reachable backend serves
    policy: str = "length"
    host: str = "127.0.0.1"
    port: int = 9000
    max_connections: int = 256  # per backend: requests beyond it wait for a connection
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0  # longest silence allowed from a backend: before its response, between two chunks

    def argv(self, python: str | None = None) -> list[str]:
        """The `qwen3lab router ...` command line that serves this config (exports and launches use it)."""
        head = [python, "-m", "qwen3lab"] if python else ["qwen3lab"]
        out = [*head, "router"]
        for name, url in self.routes.items():
            out += ["--route", f"{name}={url}"]
        out += ["--threshold-tokens", str(self.threshold_tokens)]
        if self.tokenizer:
            out += ["--tokenizer", self.tokenizer]
        if self.policy != "length":
            out += ["--policy", self.policy]
        for flag, name in (("--max-connections", "max_connections"), ("--connect-timeout", "connect_timeout_s"),
                           ("--read-timeout", "read_timeout_s")):
            if getattr(self, name) != RouterConfig.__dataclass_fields__[name].default:  # else the CLI's default
                out += [flag, str(getattr(self, name))]
        return out + ["--host", self.host, "--port", str(self.port)]


def parse_routes(items: list[str]) -> dict[str, str]:
    """`NAME=URL` strings -> {name: url}; a clear error for anything else."""
    routes: dict[str, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name:
            raise SpecError("--route", item, "NAME=URL, e.g. short=http://127.0.0.1:8001",
                            "write the route's name, '=', then its backend's base URL")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SpecError(f"--route {name}", url, "an http:// or https:// base URL with a host",
                            "give the backend's address, e.g. http://127.0.0.1:8001")
        if name in routes:
            raise SpecError("--route", name, "each route name once", "drop the repeated --route")
        routes[name] = url.rstrip("/")
    return routes


def validate(config: RouterConfig) -> None:
    if config.policy not in POLICIES:
        raise SpecError("--policy", config.policy, ", ".join(POLICIES), "pick one of them")
    if config.policy == "length" and sorted(config.routes) != sorted(ROUTES):
        raise SpecError("--route", ", ".join(config.routes) or "(none)", "exactly two routes: short and long",
                        "pass --route short=URL --route long=URL")
    if not config.routes:
        raise SpecError("--route", "(none)", "at least one NAME=URL", "pass --route NAME=URL")
    if config.threshold_tokens < 1:
        raise SpecError("--threshold-tokens", config.threshold_tokens, "a whole number of tokens >= 1",
                        "prompts of at most this many tokens go to short")


# --- the server ----------------------------------------------------------------------------------------
class Backend:
    def __init__(self, name: str, url: str):
        self.name, self.url = name, url
        self.session = None  # opened on the server's loop (aiohttp binds a pool to the loop that made it)

    def open(self, config: RouterConfig) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=config.max_connections, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s,
                                          sock_read=config.read_timeout_s),
            auto_decompress=False)

    def describe(self) -> str:
        return f"backend {self.name} ({self.url})"


class Metrics:
    def __init__(self, routes):
        from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

        disable_created_metrics()  # the router's own process: *_created series are noise to a scraper
        self.registry = CollectorRegistry()
        self.requests = Counter("qwen3lab_router_requests", "Requests routed, by route.", ["route"],
                                registry=self.registry)
        self.errors = Counter("qwen3lab_router_errors", "Requests that failed, by route and reason.",
                              ["route", "reason"], registry=self.registry)
        self.added = Histogram("qwen3lab_router_added_latency_seconds",
                               "Router time on a request's first-token path: receipt to backend send, plus "
                               "first backend chunk to its write.", ["route"], buckets=_LATENCY_BUCKETS,
                               registry=self.registry)
        self.tokens = Histogram("qwen3lab_router_prompt_tokens", "Prompt tokens, by route, of the prompts counted "
                                "(those whose length alone did not decide the route).", ["route"],
                                buckets=(64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),
                                registry=self.registry)
        for r in routes:  # every route appears at 0 before its first request
            self.requests.labels(r)
            self.added.labels(r)


def _error_body(message: str, kind: str, code: int) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


class Router:
    def __init__(self, config: RouterConfig, counter: PromptCounter):
        self.config, self.counter = config, counter
        self.backends = {name: Backend(name, url) for name, url in config.routes.items()}
        self.metrics = Metrics(self.backends)
        self._turns = itertools.cycle(list(self.backends))

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)  # a 128k-token prompt is a few MiB of JSON
        app.router.add_post("/v1/completions", lambda r: self.proxy(r, "completion"))
        app.router.add_post("/v1/chat/completions", lambda r: self.proxy(r, "chat"))
        app.router.add_get("/v1/models", self.models)
        for path in ("/tokenize", "/detokenize"):  # the same tokenizer on every route: the first one answers
            app.router.add_post(path, self.forward)
        app.router.add_get("/version", self.forward)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        app.on_startup.append(self.open)
        app.on_cleanup.append(self.close)
        return app

    async def open(self, _app=None) -> None:
        for b in self.backends.values():
            b.open(self.config)

    async def close(self, _app=None) -> None:
        for b in self.backends.values():
            if b.session is not None:
                await b.session.close()

    def choose(self, tokens: int | None) -> str:
        """tokens: the prompt's count, None when its length alone kept it under the threshold (length policy)."""
        if self.config.policy == "round-robin":
            return next(self._turns)
        return "short" if tokens is None or tokens <= self.config.threshold_tokens else "long"

    async def proxy(self, request, api: str):
        import aiohttp
        from aiohttp import web

        start = time.perf_counter()
        raw = await request.read()
        try:
            body = json.loads(raw)
            if self.config.policy == "length":  # a prompt whose length alone puts it under the threshold: not counted
                count = lambda: self.counter.count_above(body, api, self.config.threshold_tokens)  # noqa: E731
                tokens = await asyncio.to_thread(count) if len(raw) > _OFFLOAD_CHARS else count()
            else:
                tokens = None  # round-robin needs no count
        except (ValueError, TypeError, AttributeError) as exc:
            self.metrics.errors.labels("none", "bad_request").inc()
            return web.Response(status=400, body=_error_body(f"qwen3lab router: {exc}", "BadRequestError", 400),
                                content_type="application/json")
        name = self.choose(tokens)
        backend = self.backends[name]
        self.metrics.requests.labels(name).inc()
        if tokens is not None:
            self.metrics.tokens.labels(name).observe(tokens)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        before_send = time.perf_counter() - start
        try:
            upstream = await backend.session.post(backend.url + request.path, data=raw, headers=headers)
        except aiohttp.SocketTimeoutError:  # connected and sent, then silent: a hung backend, not a missing one
            self.metrics.errors.labels(name, "timeout").inc()
            msg = (f"qwen3lab router: {backend.describe()} sent no response within {self.config.read_timeout_s:g} s "
                   f"(--read-timeout)")
            return web.Response(status=504, body=_error_body(msg, "BackendTimeout", 504),
                                content_type="application/json", headers={ROUTE_HEADER: name})
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.metrics.errors.labels(name, "unreachable").inc()
            msg = f"qwen3lab router: {backend.describe()} is unreachable: {type(exc).__name__}: {exc}"
            return web.Response(status=502, body=_error_body(msg, "BackendUnreachable", 502),
                                content_type="application/json", headers={ROUTE_HEADER: name})
        try:
            if upstream.status != 200:
                self.metrics.errors.labels(name, f"http_{upstream.status}").inc()
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            out_headers[ROUTE_HEADER] = name
            if tokens is not None:
                out_headers[TOKENS_HEADER] = str(tokens)
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=out_headers)
            if upstream.content_length is not None:
                out.content_length = upstream.content_length
            await out.prepare(request)
            first = True
            chunks = upstream.content.iter_any().__aiter__()
            while True:
                try:
                    data = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    return await self._broken(request, out, backend, upstream, exc)
                got = time.perf_counter()
                try:
                    await out.write(data)
                except (ConnectionError, RuntimeError):  # the client left: closing upstream aborts the request
                    self.metrics.errors.labels(name, "client_gone").inc()
                    return out
                if first:
                    first = False
                    self.metrics.added.labels(name).observe(before_send + time.perf_counter() - got)
            await out.write_eof()
            return out
        finally:
            upstream.release()

    async def _broken(self, request, out, backend: Backend, upstream, exc: Exception):
        """A backend ended its response early: an SSE error event (what vLLM itself sends) closes the stream."""
        why = "timeout" if isinstance(exc, asyncio.TimeoutError) else "disconnected"
        self.metrics.errors.labels(backend.name, why).inc()
        detail = f"no data for {self.config.read_timeout_s:g} s, --read-timeout" if why == "timeout" \
            else f"{type(exc).__name__}: {exc}"
        msg = f"qwen3lab router: {backend.describe()} broke off the response mid-stream ({detail})"
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            try:
                await out.write(b"data: " + _error_body(msg, "BackendDisconnected", 502) + b"\n\n")
                await out.write_eof()
            except (ConnectionError, RuntimeError):
                pass  # the client left too
        elif request.transport is not None:
            request.transport.close()  # a plain JSON body cannot carry an error once started: cut it short
        return out

    async def forward(self, request):
        """A request that is no one route's business, answered by the first route's server as it is."""
        import aiohttp
        from aiohttp import web

        backend = next(iter(self.backends.values()))
        try:
            async with backend.session.request(request.method, backend.url + request.path, data=await request.read(),
                                               headers={k: v for k, v in request.headers.items()
                                                        if k.lower() not in _HOP}) as resp:
                return web.Response(status=resp.status, body=await resp.read(),
                                    headers={k: v for k, v in resp.headers.items() if k.lower() not in _HOP})
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            msg = f"qwen3lab router: {backend.describe()} is unreachable: {type(exc).__name__}: {exc}"
            return web.Response(status=502, body=_error_body(msg, "BackendUnreachable", 502),
                                content_type="application/json")

    async def models(self, request):
        from aiohttp import web

        merged: dict[str, dict] = {}
        for b in self.backends.values():
            try:
                async with b.session.get(b.url + "/v1/models", timeout=_probe_timeout()) as resp:
                    data = (await resp.json()).get("data", []) if resp.status == 200 else []
            except Exception:
                continue
            for m in data:  # one entry per model id; the longest max_model_len among the routes serves it
                seen = merged.setdefault(m["id"], dict(m))
                seen["max_model_len"] = max(seen.get("max_model_len") or 0, m.get("max_model_len") or 0) or None
        if not merged:
            return web.json_response({"error": {"message": "qwen3lab router: no backend answered /v1/models",
                                                "type": "BackendUnreachable", "code": 502}}, status=502)
        return web.json_response({"object": "list", "data": list(merged.values())})

    async def health(self, request):
        from aiohttp import web

        async def one(b: Backend) -> str | None:
            try:
                async with b.session.get(b.url + "/health", timeout=_probe_timeout()) as resp:
                    return None if resp.status == 200 else f"/health answered HTTP {resp.status}"
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"

        problems = dict(zip(self.backends, await asyncio.gather(*(one(b) for b in self.backends.values()))))
        down = {n: p for n, p in problems.items() if p}
        body = {n: ("ok" if not p else f"down: {p}") for n, p in problems.items()}
        if down:
            body["error"] = "; ".join(f"{self.backends[n].describe()} is down ({p})" for n, p in down.items())
        return web.json_response(body, status=503 if down else 200)

    async def prometheus(self, request):
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _probe_timeout():
    import aiohttp

    return aiohttp.ClientTimeout(total=2.0)


def discover_tokenizer(routes: dict[str, str]) -> str:
    """The folder a backend serves (`root` in its /v1/models), when it holds a tokenizer."""
    from qwen3lab.measure.engine import http_get

    tried = []
    for name, url in routes.items():
        try:
            status, body = http_get(url + "/v1/models", timeout=5)
            roots = [m.get("root") for m in json.loads(body).get("data", [])] if status == 200 else []
        except (OSError, ValueError) as exc:
            tried.append(f"{name}: {exc}")
            continue
        for root in roots:
            if root and (Path(root) / "tokenizer.json").is_file():
                return root
        tried.append(f"{name}: serves {roots or 'nothing'}, no local tokenizer.json")
    raise SpecError("--tokenizer", None, "a tokenizer folder, builtin:NAME or hub id",
                    f"pass --tokenizer (no backend named a local tokenizer: {'; '.join(tried)})")


def tokenizer_path(source: str) -> str:
    from qwen3lab.models import BUILTIN_PREFIX, default_tokenizer, resolve_model_path

    if source.startswith(BUILTIN_PREFIX):
        return default_tokenizer(source) or resolve_model_path(source)
    return source


def serve(config: RouterConfig, ready=print) -> None:
    """Run the router until SIGINT or SIGTERM (the `qwen3lab router` command)."""
    from aiohttp import web

    validate(config)
    counter = PromptCounter(tokenizer_path(config.tokenizer or discover_tokenizer(config.routes)))
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    routes = ", ".join(f"{n} -> {u}" for n, u in config.routes.items())
    rule = (f"prompts of at most {config.threshold_tokens} tokens to short" if config.policy == "length"
            else "each route in turn")
    web.run_app(Router(config, counter).app(), host=config.host, port=config.port, access_log=None, loop=loop,
                print=lambda _: ready(f"qwen3lab router on http://{config.host}:{config.port}: {routes}; {rule} "
                                      f"(tokenizer {counter.source})"))


# --- a router as a child process (tests, the split topology, the bench) --------------------------------
@dataclass(frozen=True)
class RunningRouter:
    url: str
    process: subprocess.Popen
    log_path: Path


@contextmanager
def launch(config: RouterConfig, log_path: str | os.PathLike, ready_timeout_s: float = 120.0) -> Iterator[RunningRouter]:
    """Start `qwen3lab router` in its own process; yield it once it answers; always stop it on the way out."""
    from qwen3lab.measure.engine import _die_with_parent, http_get, port_is_free

    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = config.argv(sys.executable)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                                     os.environ.get("PYTHONPATH")]))}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                preexec_fn=_die_with_parent)
    url = f"http://{config.host}:{config.port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                raise EngineError("failed", f"the router exited ({proc.returncode}): {' | '.join(tail)}", str(log_path))
            try:
                if http_get(url + "/metrics", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise EngineError("timeout", f"the router did not answer within {ready_timeout_s:.0f} s", str(log_path))
            time.sleep(0.1)
        yield RunningRouter(url, proc, log_path)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        deadline = time.monotonic() + 10
        while not port_is_free(config.port, config.host) and time.monotonic() < deadline:
            time.sleep(0.1)
