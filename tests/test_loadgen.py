"""The load generator and metrics against a real vLLM server (the tiny Qwen3 on the CPU)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from qwen3lab.analysis import metrics
from qwen3lab.measure import runner, workload as wl
from qwen3lab.measure.loadgen import run_load
from qwen3lab.experiment.spec import SLO, RequestClass, Trial
from qwen3lab.measure.telemetry import MetricsScraper, parse_metrics

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
    async def scrape():
        import aiohttp

        s = MetricsScraper(tiny_server.base_url, 1.0, 0.0)
        async with aiohttp.ClientSession() as session:
            await s.scrape_once(session)
        return {name: v for _, _, name, v in s.samples}

    before = asyncio.run(scrape())
    w = small_workload(num_requests=4, mix=[RequestClass(name="s", prompt_tokens=8, output_tokens=16)])
    _load(tiny_server, w, tok)
    after = asyncio.run(scrape())
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 4 * 16
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 4 * 8
    assert 0 <= after["vllm:kv_cache_usage_perc"] <= 1
    assert {"vllm:num_requests_running", "vllm:prefix_cache_queries_total"} <= set(after)


def test_parse_metrics_sums_label_sets_and_reads_old_names():
    text = ('# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
            '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
            '# TYPE other_metric gauge\nother_metric 7\n')
    assert parse_metrics(text) == {"vllm:num_requests_running": 5.0, "vllm:kv_cache_usage_perc": 0.5}
