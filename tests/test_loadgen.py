"""The load generator and metrics against a real vLLM server (the tiny Qwen3 on the CPU)."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from qwen3lab.analysis import metrics
from qwen3lab.measure import runner, workload as wl
from qwen3lab.measure.loadgen import run_load
from qwen3lab.experiment.spec import SLO, RequestClass, Trial
from qwen3lab.measure.telemetry import MetricsFetch, MetricsScraper, parse_metrics

from .conftest import small_workload, tiny_config


@pytest.fixture(scope="module")
def tok():
    return wl.load_tokenizer(wl.tokenizer_source(tiny_config()))


def _load(server, workload, tok, template=0):
    reqs = wl.build_requests(workload, tok, server.info["max_model_len"], template)
    return reqs, asyncio.run(run_load(server.base_url, server.model_name, reqs, workload))


def test_exact_lengths_and_vllm_timing_rules(tiny_server, tok):
    w = small_workload(mix=[RequestClass(name="r", prompt_tokens=(16, 400), output_tokens=(2, 64))], warmup_requests=2)
    reqs, result = _load(tiny_server, w, tok)
    measured = [r for r in result.records if not r.warmup]
    assert len(measured) == w.num_requests and all(r.ok for r in result.records)
    for rec, req in zip(result.records, reqs):
        assert rec.prompt_tokens == req.prompt_tokens  # the server counted exactly what we built
        assert rec.output_tokens == req.output_tokens  # ignore_eos: exactly max_tokens
        assert 1 <= len(rec.chunk_times) <= rec.output_tokens
        assert rec.ttft == rec.chunk_times[0] and rec.e2el == rec.chunk_times[-1]
        assert np.all(np.diff(rec.chunk_times) >= 0)
    table = metrics.RequestTable.from_records(result.records)
    s = metrics.summarize(table, result.duration_s, SLO(ttft_ms=10_000, tpot_ms=10_000))
    assert s["completed"] == w.num_requests and s["failed"] == 0
    assert s["total_output_tokens"] == sum(r.output_tokens for r in reqs[2:])
    assert s["output_throughput"] == pytest.approx(s["total_output_tokens"] / result.duration_s)
    # TPOT by vLLM's definition, recomputed by hand for one request.
    r = measured[0]
    assert table.tpot()[0] == pytest.approx((r.e2el - r.ttft) / (r.output_tokens - 1))
    assert s["request_goodput"] == pytest.approx(s["request_throughput"])  # generous SLOs: all good
    strict = metrics.summarize(table, result.duration_s, SLO(ttft_ms=1e-3))
    assert strict["request_goodput"] == 0.0


def test_chat_endpoint_counts_the_template_and_thinking_switch(tiny_server, tok):
    counts = {}
    for thinking in (True, False):
        w = small_workload(api="chat", enable_thinking=thinking, num_requests=4, concurrency=4)
        trial = Trial(experiment="t", name="chat", engine=tiny_config(), workload=w)
        template = runner._chat_template_tokens(tiny_server, trial)
        reqs, result = _load(tiny_server, w, tok, template)
        assert all(r.ok for r in result.records)
        assert [r.prompt_tokens for r in result.records] == [q.prompt_tokens for q in reqs]
        counts[thinking] = template
    # Qwen3's template adds an empty <think></think> block when thinking is off.
    assert counts[False] > counts[True] > 0


def test_request_rate_spaces_the_sends(tiny_server, tok):
    w = small_workload(num_requests=12, request_rate=8.0, burstiness=1.0, concurrency=None,
                       mix=[RequestClass(name="s", prompt_tokens=8, output_tokens=4)])
    _, result = _load(tiny_server, w, tok)
    sent = sorted(r.sent_at for r in result.records)
    offsets = wl.arrival_offsets(w, 12)
    assert np.allclose(sent, offsets, atol=0.25)


def test_scraper_reads_vllm_metrics(tiny_server, tok):
    # The scraper is a child process (off the load's loop); its clock is perf_counter's, in every process.
    t0 = time.perf_counter()
    with MetricsScraper(tiny_server.base_url, 0.2, t0, tiny_server.headers) as scraper:
        w = small_workload(num_requests=4, mix=[RequestClass(name="s", prompt_tokens=8, output_tokens=16)])
        time.sleep(0.5)  # a first scrape before the load
        _load(tiny_server, w, tok)
        time.sleep(0.3)
        live = list(scraper.so_far())  # during the load (a capacity point's saturation check reads these)
    elapsed = time.perf_counter() - t0
    assert live and {name for _, _, name, _ in live} >= {"vllm:num_requests_waiting", "vllm:generation_tokens_total"}
    assert live == scraper.samples[:len(live)]  # the same samples, in order, as the whole file read at the end
    series = {}
    for t, source, name, v in scraper.samples:
        assert source == "vllm" and 0 <= t <= elapsed
        series.setdefault(name, []).append(v)
    assert scraper.errors == 0 and len(series["vllm:generation_tokens_total"]) >= 2
    gen, prompt = series["vllm:generation_tokens_total"], series["vllm:prompt_tokens_total"]
    assert gen[-1] - gen[0] == 4 * 16 and prompt[-1] - prompt[0] == 4 * 8  # the final scrape saw the last request
    assert all(0 <= v <= 1 for v in series["vllm:kv_cache_usage_perc"])
    assert {"vllm:num_requests_running", "vllm:prefix_cache_queries_total"} <= set(series)
    missing = MetricsFetch(tiny_server.base_url + "/no-such-page")
    try:
        assert missing.get() is None
    finally:
        missing.close()


def test_parse_metrics_sums_label_sets_and_reads_old_names():
    text = ('# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
            '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
            '# TYPE other_metric gauge\nother_metric 7\n'
            '# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{model_name="a b}c"} 12.0 1700000000\n'
            'vllm:prompt_tokens_created{model_name="m"} 1.7e9\n'
            'vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 4.0\n'
            'vllm:generation_tokens_total 3e2\n')
    assert parse_metrics(text) == {"vllm:num_requests_running": 5.0, "vllm:kv_cache_usage_perc": 0.5,
                                   "vllm:prompt_tokens_total": 12.0, "vllm:generation_tokens_total": 300.0}


def test_metrics_fetch_keeps_its_connection_and_reopens_one_the_server_dropped():
    """One connection for every scrape, as Prometheus does; a connection the server closed while idle (its
    keep-alive timeout, longer scrape intervals) costs no scrape: the fetch opens a new one once."""
    import http.server
    import threading

    seen = {"connections": set(), "drop_next": False}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            seen["connections"].add(self.client_address)
            body = b'vllm:num_requests_running{model_name="m"} 3.0\n'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            if seen["drop_next"]:  # closed without a word, as an idle timeout does
                seen["drop_next"], self.close_connection = False, True

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fetch = MetricsFetch(f"http://127.0.0.1:{server.server_address[1]}/metrics")
    try:
        assert [fetch.get() for _ in range(3)] == [{"vllm:num_requests_running": 3.0}] * 3
        assert len(seen["connections"]) == 1
        seen["drop_next"] = True
        assert fetch.get() == {"vllm:num_requests_running": 3.0}
        time.sleep(0.2)  # the server has closed it
        assert fetch.get() == {"vllm:num_requests_running": 3.0}  # on a new connection, not a failed scrape
        assert len(seen["connections"]) == 2
    finally:
        fetch.close()
        server.shutdown()
        server.server_close()


def test_stream_parser_gives_the_same_events_however_the_bytes_are_cut():
    """The one-chunk-one-event fast path and the general path agree: whole chunks one per read, several per
    read, cut anywhere, a chunk extension, an event spread over two chunks."""
    from qwen3lab.measure.loadgen import _StreamProtocol

    events = [b'data: {"choices":[{"text":"' + str(i).encode() * i + b'"}]}' for i in range(1, 6)] + [b"data: [DONE]"]

    def chunk(payload: bytes, ext: bytes = b"") -> bytes:
        return f"{len(payload):x}".encode() + ext + b"\r\n" + payload + b"\r\n"

    body = b"".join(chunk(e + b"\n\n") for e in events[:3])
    body += chunk(events[3] + b"\n\n", b";x=1")  # an extension: the general path
    body += chunk(events[4][:7]) + chunk(events[4][7:] + b"\n\n")  # one event in two chunks
    body += chunk(events[5] + b"\n\n") + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    stream = head + body
    cuts_list = [[len(head)] + [len(head) + body.index(chunk(e + b"\n\n")) for e in events[1:3]], list(range(1, len(stream))),
                 [len(head) // 2, len(head) + 3, len(stream) - 4], []]

    async def parse(cuts):
        got = []
        proto = _StreamProtocol(lambda msg, now: got.append(msg))
        for a, b in zip([0, *cuts], [*cuts, len(stream)]):
            proto.data_received(stream[a:b])
        return proto.status, got

    for cuts in cuts_list:
        status, got = asyncio.run(parse(cuts))
        assert status == 200 and got == events, cuts


def test_one_connection_carries_one_response_after_another():
    """Kept alive: a response ends at its last chunk (or its Content-Length), not when the server closes, and
    the next response on the same connection is parsed from a clean state."""
    from qwen3lab.measure.loadgen import _StreamProtocol

    sse = b'data: {"choices":[{"text":"a"}]}\n\n'
    ok = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
          + f"{len(sse):x}".encode() + b"\r\n" + sse + b"\r\n0\r\n\r\n")
    err_body = b'{"error":"too long"}'
    err = b"HTTP/1.1 400 Bad Request\r\ncontent-length: " + str(len(err_body)).encode() + b"\r\n\r\n" + err_body
    closing = ok.replace(b"chunked\r\n", b"chunked\r\nconnection: close\r\n", 1)

    async def go():
        got = []
        proto = _StreamProtocol()
        outcomes = []
        for response, cut in ((ok, len(ok) - 3), (err, len(err) - 5), (ok, len(ok) - 2), (closing, 10)):
            proto.start(lambda msg, now: got.append(msg))
            proto.data_received(response[:cut])
            first_part_ended = proto.done.done()
            proto.data_received(response[cut:])
            outcomes.append((first_part_ended, proto.done.done(), proto.status, proto.reusable))
        return got, outcomes, proto.body

    got, outcomes, body = asyncio.run(go())
    assert got == [sse[:-2]] * 3
    assert outcomes == [(False, True, 200, True), (False, True, 400, True), (False, True, 200, True),
                        (False, True, 200, False)]
    assert body == b""  # the last response's state: the error body went with its response


def test_requests_share_kept_alive_connections(tiny_server, tok):
    """As vllm bench's aiohttp session does: a closed loop of 2 sends 12 requests on about 2 connections, not 12."""
    w = small_workload(num_requests=10, concurrency=2, warmup_requests=2)
    _, result = _load(tiny_server, w, tok)
    assert all(r.ok for r in result.records) and len(result.records) == 12
    assert 1 <= result.connections <= 4, result.connections  # 2, plus a retry should the server close an idle one
