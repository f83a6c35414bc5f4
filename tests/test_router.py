"""The length-aware router in front of a real vLLM server (the embedded default): token counts against what the
server itself counted, routes by threshold, bytes through unchanged, a backend down at start, a backend killed
mid-stream (the last test: it kills this module's server)."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from contextlib import contextmanager

import pytest
from typer.testing import CliRunner

from qwen3lab.cli import app
from qwen3lab.measure import engine, router
from qwen3lab.measure.prompt_tokens import PromptCounter
from qwen3lab.measure.workload import build_requests, load_tokenizer

from .conftest import small_workload, tiny_config

THRESHOLD = 64
TINY_TOKENIZER = "builtin:qwen3-tiny"


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    """This module's own vLLM server: the last test kills it, so it is not the session's shared one."""
    log = tmp_path_factory.mktemp("router-backend") / "server.log"
    with engine.launch(tiny_config(), log, ready_timeout_s=600) as server:
        yield server


@pytest.fixture(scope="module")
def routed(backend, tmp_path_factory):
    """A router with both routes on the one server (the route is told by the header, not by the server)."""
    cfg = router.RouterConfig({"short": backend.base_url, "long": backend.base_url}, THRESHOLD,
                              port=engine.free_port())  # no --tokenizer: found from the backend's /v1/models
    with router.launch(cfg, tmp_path_factory.mktemp("router") / "router.log") as running:
        yield running.url


def post(url: str, path: str, body: dict, timeout: float = 60) -> tuple[int, dict, bytes]:
    """POST and read the whole body (de-chunked) as bytes: (status, lower-cased headers, body)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def events(raw: bytes) -> list[dict]:
    pieces = [e.strip() for e in raw.split(b"\n\n")]  # a read may start mid-event: strip its leftover newline
    return [json.loads(e[5:]) for e in pieces if e.startswith(b"data:") and e[5:].strip() != b"[DONE]"]


def usage(raw: bytes) -> dict:
    return next(e["usage"] for e in events(raw) if e.get("usage"))


def completion(model: str, prompt: str, max_tokens: int = 4, **extra) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0, "stream_options": {"include_usage": True}, **extra}


def test_bad_routes_are_refused_with_the_fix():
    runner = CliRunner()
    cases = {("--route", "short:http://x"): "NAME=URL",
             ("--route", "short=ftp://x", "--route", "long=http://y"): "http:// or https://",
             ("--route", "short=http://x"): "exactly two routes: short and long"}
    for args, says in cases.items():
        got = runner.invoke(app, ["router", *args, "--threshold-tokens", "10"])
        assert got.exit_code == 2 and says in " ".join(got.output.split()), got.output
    got = runner.invoke(app, ["router", "--route", "short=http://x", "--route", "long=http://y", "--threshold-tokens", "0"])
    assert got.exit_code == 2 and "--threshold-tokens = 0" in got.output


def test_prompt_tokens_and_routes_match_what_vllm_counted(backend, routed):
    tok = load_tokenizer(router.tokenizer_path(TINY_TOKENIZER))
    # Completions around the threshold: exact lengths from the workload builder, then odd text.
    built = build_requests(small_workload(mix=[{"name": "p", "prompt_tokens": (THRESHOLD - 3, THRESHOLD + 3),
                                                "output_tokens": 2}], num_requests=8), tok, 2048)
    prompts = [r.prompt for r in built] + ["Ünïcode, émoji 🙂 and\nnew lines\t" * 9, "x"]
    seen_routes = set()
    for prompt in prompts:
        status, headers, raw = post(routed, "/v1/completions", completion(backend.model_name, prompt))
        assert status == 200, raw
        served = usage(raw)["prompt_tokens"]
        if router.TOKENS_HEADER in headers:  # counted: exactly as vLLM counted
            assert int(headers[router.TOKENS_HEADER]) == served, prompt
        else:  # not counted: only a prompt whose bytes alone keep it under the threshold
            assert len(prompt.encode()) <= THRESHOLD, prompt
        assert headers[router.ROUTE_HEADER] == ("short" if served <= THRESHOLD else "long"), prompt
        seen_routes.add(headers[router.ROUTE_HEADER])
    assert seen_routes == {"short", "long"}
    assert router.TOKENS_HEADER not in post(routed, "/v1/completions", completion(backend.model_name, "x"))[1]
    # Chat: the template rendered (thinking on and off, a list-of-parts message, a system turn).
    chats = [
        {"messages": [{"role": "user", "content": built[0].prompt}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "hello"}, {"role": "user", "content": built[1].prompt}],
         "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                   {"type": "text", "text": built[2].prompt}]}]},
    ]
    for chat in chats:
        body = {"model": backend.model_name, "max_completion_tokens": 2, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}, **chat}
        status, headers, raw = post(routed, "/v1/chat/completions", body)
        assert status == 200, raw
        assert int(headers[router.TOKENS_HEADER]) == usage(raw)["prompt_tokens"], chat


def test_a_prompt_left_uncounted_is_within_the_threshold_and_a_counted_one_is_exact():
    counter = PromptCounter(router.tokenizer_path(TINY_TOKENIZER))
    texts = ["x", "", " " * 40, "\u0958" * 30, "<|im_start|>user\nhi<|im_end|>" * 3, "🙂" * 20, "Ünïcode é\tn\n" * 5,
             "ﷺ㎏ﬁ" * 10, "word " * 30]
    left = 0
    for text in texts:
        exact = counter.completion({"prompt": text})
        for limit in (1, 8, 20, 40, 64, 200):
            got = counter.count_above({"prompt": text}, "completion", limit)
            assert got == exact if got is not None else exact <= limit, (text, limit)
            left += got is None
        chat = {"messages": [{"role": "user", "content": text}]}
        got = counter.count_above(chat, "chat", 64)
        assert got == counter.chat(chat) if got is not None else counter.chat(chat) <= 64, text
    assert left >= 10  # the bound does decide short prompts


def test_chat_template_renders_as_transformers_does():
    transformers = pytest.importorskip("transformers")
    path = router.tokenizer_path(TINY_TOKENIZER)
    ref = transformers.AutoTokenizer.from_pretrained(path)
    counter = PromptCounter(path)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "one two"}]
    for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
        want = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kwargs)
        assert counter.render_chat({"messages": msgs, "chat_template_kwargs": kwargs}) == want


def test_stream_is_the_servers_own_events(backend, routed):
    """Through the router and straight from vLLM, greedy: the same events (only vLLM's per-request id and
    creation time differ), and /v1/models, /metrics answer for the router."""
    body = completion(backend.model_name, "the same prompt both ways", max_tokens=24)
    direct = post(backend.base_url, "/v1/completions", body)[2]
    through = post(routed, "/v1/completions", body)[2]
    mask = lambda raw: re.sub(rb'"(id|created)":("[^"]*"|\d+)', b'"\\1":0', raw)  # noqa: E731
    assert mask(through) == mask(direct) and through.endswith(b"data: [DONE]\n\n")

    status, models = engine.http_get(routed + "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(models)["data"]] == [backend.model_name]
    from prometheus_client.parser import text_string_to_metric_families

    status, text = engine.http_get(routed + "/metrics")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}
    assert samples[("qwen3lab_router_requests_total", (("route", "short"),))] >= 1
    assert samples[("qwen3lab_router_added_latency_seconds_count", (("route", "short"),))] >= 1
    assert 0 < samples[("qwen3lab_router_added_latency_seconds_sum", (("route", "short"),))] < 5


def test_backend_down_at_start_is_named(backend, tmp_path):
    dead = f"http://127.0.0.1:{engine.free_port()}"
    cfg = router.RouterConfig({"short": backend.base_url, "long": dead}, THRESHOLD, port=engine.free_port())
    with router.launch(cfg, tmp_path / "router.log") as running:
        url = running.url
        status, body = engine.http_get(url + "/health")
        health = json.loads(body)
        assert status == 503 and health["short"] == "ok" and f"backend long ({dead}) is down" in health["error"]
        status, headers, raw = post(url, "/v1/completions", completion(backend.model_name, "short one"))
        assert status == 200 and headers[router.ROUTE_HEADER] == "short"
        status, headers, raw = post(url, "/v1/completions", completion(backend.model_name, " word" * 200))
        assert status == 502 and f"backend long ({dead}) is unreachable" in json.loads(raw)["error"]["message"]
        text = engine.http_get(url + "/metrics")[1].decode()
        assert 'qwen3lab_router_errors_total{reason="unreachable",route="long"} 1.0' in text


def test_router_listens_on_loopback_only_by_default(tmp_path):
    """`qwen3lab router` as a user types it, without --host: only 127.0.0.1 is listened on, and this host's other
    addresses refuse. Its backends need not be up to start (the tokenizer is given)."""
    import psutil

    port = engine.free_port()
    argv = [sys.executable, "-m", "qwen3lab", "router", "--route", "short=http://127.0.0.1:9", "--route",
            "long=http://127.0.0.1:9", "--threshold-tokens", str(THRESHOLD), "--tokenizer", TINY_TOKENIZER,
            "--port", str(port)]
    with open(tmp_path / "router.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if engine.http_get(f"http://127.0.0.1:{port}/metrics", timeout=1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "router.log").read_text()
        listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(proc.pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN}
        assert listening == {("127.0.0.1", port)}
        others = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                  if a.family == socket.AF_INET and not a.address.startswith("127.")]
        for address in others:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((address, port), timeout=5).close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


READ_TIMEOUT_S = 2.0
_FIRST_EVENT = b'data: {"choices": [{"text": "a"}]}\n\n'
SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"%x\r\n" % len(_FIRST_EVENT) + _FIRST_EVENT + b"\r\n")  # one chunk of the chunked body


@contextmanager
def silent_backend(head: bytes):
    """A hung backend: it accepts a request, writes `head` (nothing, or a stream's first event) and then nothing
    more, holding the connection open until the test ends."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    held, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)
            try:
                conn.settimeout(10)
                conn.recv(1 << 16)  # the request
                conn.sendall(head)
            except OSError:
                pass  # the router left first: nothing to hold

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize("head", [b"", SSE_HEAD], ids=["before-the-response", "mid-stream"])
def test_a_silent_backend_ends_the_request_with_a_timeout_error_after_the_read_timeout(tmp_path, head):
    """A backend that accepts the request and goes silent: the client gets a timeout error naming the backend
    once --read-timeout has passed (a 504 before the response starts, an SSE error event mid-stream), not a hang."""
    with silent_backend(head) as url:
        cfg = router.RouterConfig({"short": url, "long": url}, THRESHOLD, tokenizer=TINY_TOKENIZER,
                                  port=engine.free_port(), read_timeout_s=READ_TIMEOUT_S)
        with router.launch(cfg, tmp_path / "router.log") as running:
            parts = urllib.parse.urlsplit(running.url)
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=READ_TIMEOUT_S + 30)
            conn.request("POST", "/v1/completions", json.dumps(completion("m", "hello")),
                         {"Content-Type": "application/json"})
            silent_since = time.monotonic()
            resp = conn.getresponse()
            if head:
                assert resp.status == 200 and resp.readline().startswith(b"data:")  # the backend's own event
                silent_since = time.monotonic()
            rest = resp.read()
            took = time.monotonic() - silent_since
            conn.close()
            metrics_text = engine.http_get(running.url + "/metrics")[1].decode()
    assert READ_TIMEOUT_S * 0.9 <= took < READ_TIMEOUT_S + 10, took
    if head:
        assert b"[DONE]" not in rest
        message = events(rest)[-1]["error"]["message"]
        assert f"backend short ({url}) broke off the response mid-stream (no data for {READ_TIMEOUT_S:g} s" in message
    else:
        assert resp.status == 504 and resp.getheader(router.ROUTE_HEADER) == "short"
        message = json.loads(rest)["error"]["message"]
        assert f"backend short ({url}) sent no response within {READ_TIMEOUT_S:g} s (--read-timeout)" in message
    assert 'qwen3lab_router_errors_total{reason="timeout",route="short"} 1.0' in metrics_text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_router_stopped_leaves_no_child_and_no_port(backend, tmp_path, sig):
    """docker stop / systemd send SIGTERM, the OOM killer SIGKILL: the router exits (SIGTERM: cleanly, at once),
    its port is free, no process of it is left; its backend keeps serving."""
    import psutil

    port = engine.free_port()
    cfg = router.RouterConfig({"short": backend.base_url, "long": backend.base_url}, THRESHOLD, port=port)
    with router.launch(cfg, tmp_path / "router.log") as running:
        status, _, _ = post(running.url, "/v1/completions", completion(backend.model_name, "hello"))
        assert status == 200
        proc = psutil.Process(running.process.pid)
        tree = [proc, *proc.children(recursive=True)]
        os.kill(proc.pid, sig)
        code = running.process.wait(timeout=30)
        assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL), code
    deadline = time.monotonic() + 20
    while not engine.port_is_free(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engine.port_is_free(port)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert backend.alive()


def test_backend_killed_mid_stream_ends_the_stream_with_an_error(backend, routed):
    """Kills this module's server: keep it the last test of the module."""
    parts = urllib.parse.urlsplit(routed)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(completion(backend.model_name, "go on", max_tokens=1900)),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    first = resp.readline()
    assert first.startswith(b"data:")
    killed_at = time.monotonic()
    os.killpg(backend.process.pid, signal.SIGKILL)
    rest = resp.read()  # must end, not hang
    took = time.monotonic() - killed_at
    conn.close()
    assert took < 30, took
    assert b"[DONE]" not in rest, "a stream cut by a dead backend must not look complete"
    last = events(rest)[-1]
    assert f"backend short ({backend.base_url}) broke off the response mid-stream" in last["error"]["message"]
    status, body = engine.http_get(routed + "/health")
    assert status == 503 and f"backend short ({backend.base_url}) is down" in json.loads(body)["error"]
    text = engine.http_get(routed + "/metrics")[1].decode()
    assert 'qwen3lab_router_errors_total{reason="disconnected",route="short"} 1.0' in text
