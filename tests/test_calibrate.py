"""The calibration's pieces that run without a GPU, and the committed H200 calibration checked against the
planner as it is now (a planner change that would move the committed predictions fails here)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwen3lab.hardware import calibrate
from qwen3lab.terminal import calibration_markdown, calibration_table
from qwen3lab.models import model_info

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "experiments" / "calibration" / "h200.json"
torch = pytest.importorskip("torch", reason="the decode step is written in torch")


def test_attention_reads_each_kv_head_once_and_matches_sdpa():
    step = calibrate.Qwen3DecodeStep(torch, model_info("builtin:qwen3-tiny"), max_batch=2, context=8, device="cpu")
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, 64, dtype=torch.float64, generator=gen)
    k, v = (torch.randn(3, 2, 37, 64, dtype=torch.float64, generator=gen) for _ in range(2))
    ref = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=1.0, enable_gqa=True).squeeze(2)
    got = step.attention(q, k, v)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-12


def test_eager_step_runs_every_layer_and_writes_the_kv_cache():
    info = model_info("builtin:qwen3-tiny")
    step = calibrate.Qwen3DecodeStep(torch, info, max_batch=4, context=16, device="cpu")
    before = step.k_cache[:, :3, :, -1].clone()
    untouched = step.k_cache[:, 3].clone()
    hidden = step._run(torch.tensor([1, 2, 3]), step._pre, step.attention, step._post, lambda x: x)
    assert hidden.shape == (3, info.hidden_size) and torch.isfinite(hidden).all()
    assert not torch.equal(step.k_cache[:, :3, :, -1], before)  # each layer wrote its new K at the last slot
    assert torch.equal(step.k_cache[:, 3], untouched)  # the sequence not in the batch keeps its cache
    assert step.eager(torch.tensor([5, 6])).shape == (2,)


def test_predictions_from_limits():
    info = model_info("builtin:qwen3-14b")
    limits = {"copy_bandwidth_gbs": 4000.0, "matmul_bf16_tflops": 800.0, "kernel_floor_us": 1.0,
              "gemv_bandwidth_gbs": 4000.0, "gemv_overhead_us": 5.0}
    p = calibrate.predict_decode(info, 1, 1024, limits, kernels=600)
    # Same bandwidths: B differs from A only by the 161 GEMVs' overhead instead of their kernel floor.
    assert p["predicted_a_ms"] == pytest.approx(p["roofline_ms"] + 0.6)
    assert p["predicted_b_ms"] == pytest.approx(p["roofline_ms"] + 161 * 5e-3 + (600 - 161) * 1e-3)
    assert p["roofline_ms"] == pytest.approx(p["step_bytes"] / 4000e9 * 1e3, rel=1e-3)  # batch 1: all memory


def test_committed_h200_calibration_still_matches_the_planner():
    result = json.loads(H200.read_text())
    info = model_info(result["model"])
    assert result["gpu_id"] == "h200" and result["judged"] == {"variant": "fused", "prediction": "predicted_b_ms"}
    assert [r["batch"] for r in result["decode"]] == list(calibrate.BATCH_SIZES)
    for variant in result["variants"].values():
        for row in variant["decode"]:
            again = calibrate.predict_decode(info, row["batch"], result["context"], result["microbenchmarks"], row["kernels"])
            for key in ("roofline_ms", "predicted_a_ms", "predicted_b_ms"):
                assert again[key] == pytest.approx(row[key], rel=1e-9), (row["batch"], key)
    worst = max(abs(r["predicted_b_ms"] / r["measured_ms"] - 1) for r in result["variants"]["fused"]["decode"])
    assert worst == pytest.approx(result["worst_error"]) and worst <= 0.15 and result["within_target"]


def test_committed_markdown_is_the_json_rendered():
    result = json.loads(H200.read_text())
    assert (H200.with_suffix(".md")).read_text() == calibration_markdown(result)
    assert calibration_table(result).row_count == 20
