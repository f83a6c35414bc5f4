"""What a traffic file holds (`qwen3lab traffic FILE`), and a shape-only copy of it that carries no text.

Text is measured in tokens of the given tokenizer. Prefix reuse: for hash ids, the share of blocks that an
earlier request had already sent; for text, the share of prompt characters that begin like another prompt
(the longest common prefix with a neighbour in sorted order).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from qwen3lab.traffic.sources import Traffic

PERCENTILES = (50, 90, 99)


def _lengths(traffic: Traffic, tokenizer) -> tuple[list[int | None], list[int | None]]:
    def count(text):
        return tokenizer.count(text) if tokenizer is not None and text is not None else None

    prompt = [e.prompt_tokens if e.text is None else count(e.text) for e in traffic.entries]
    output = [e.output_tokens if e.output_tokens is not None else count(e.reply) for e in traffic.entries]
    return prompt, output


def _percentiles(values: list) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"min": int(min(vals)), **{f"p{q}": float(np.percentile(vals, q)) for q in PERCENTILES},
            "max": int(max(vals)), "mean": float(np.mean(vals))}


def prefix_reuse(traffic: Traffic) -> dict | None:
    if any(e.hash_ids for e in traffic.entries):
        seen: set[int] = set()
        total = reused = 0
        for e in traffic.entries:
            for h in e.hash_ids or []:
                total += 1
                reused += h in seen
                seen.add(h)
        return {"kind": "hash_ids", "blocks": total, "reused_blocks": reused,
                "reuse_fraction": reused / total if total else 0.0}
    texts = sorted(e.text for e in traffic.entries if e.text)
    if len(texts) < 2:
        return None
    shared = 0
    for i, t in enumerate(texts):
        best = 0
        for j in (i - 1, i + 1):
            if 0 <= j < len(texts):
                o = texts[j]
                n = 0
                while n < min(len(t), len(o)) and t[n] == o[n]:
                    n += 1
                best = max(best, n)
        shared += best
    return {"kind": "text", "shared_prefix_char_fraction": shared / sum(len(t) for t in texts)}


def summary(traffic: Traffic, tokenizer=None, bins: int = 20) -> dict:
    """Requests, duration, rate over time, length percentiles, prefix reuse and turns per session."""
    prompt, output = _lengths(traffic, tokenizer)
    times = [e.at for e in traffic.entries if e.at is not None]
    out = {"path": str(traffic.path), "format": traffic.format, "digest": traffic.digest,
           "requests": len(traffic.entries), "skipped_rows": traffic.skipped,
           "prompt_tokens": _percentiles(prompt), "output_tokens": _percentiles(output),
           "prefix_reuse": prefix_reuse(traffic), "duration_s": None, "rate": None}
    if times:
        duration = max(times)
        out["duration_s"] = duration
        edges = np.linspace(0, duration or 1.0, bins + 1)
        counts, _ = np.histogram(times, bins=edges)
        width = float(edges[1] - edges[0])
        out["rate"] = {"mean_per_s": len(times) / duration if duration else None, "bin_s": width,
                       "per_s": [float(c / width) for c in counts]}
    if traffic.multi_turn:
        turns: dict[str, int] = {}
        for e in traffic.entries:
            turns[e.session] = turns.get(e.session, 0) + 1
        out["sessions"] = len(turns)
        out["turns_per_session"] = _percentiles(list(turns.values()))
    return out


def export_shape(traffic: Traffic, out: Path, tokenizer=None) -> int:
    """Lengths, times, hash ids and sessions, no text: mooncake JSONL, or conversations JSONL when multi-turn.
    Both read back as a source. Returns the lines written."""
    prompt, output = _lengths(traffic, tokenizer)
    if None in prompt:
        raise ValueError("a text file's lengths need a tokenizer: pass --tokenizer")
    lines = []
    for e, p, o in zip(traffic.entries, prompt, output):
        rec: dict = {}
        if traffic.multi_turn:
            rec |= {"session_id": e.session, "turn": e.turn}
            if e.delay_s is not None:
                rec["delay_ms"] = round(e.delay_s * 1000, 3)
        if e.at is not None:
            rec["timestamp"] = round(e.at * 1000, 3)
        rec |= {"input_length": p, "output_length": o if o is not None else None}
        if e.hash_ids is not None:
            rec["hash_ids"] = e.hash_ids
        lines.append(json.dumps(rec))
    out.write_text("\n".join(lines) + "\n")
    return len(lines)


def open_file(path: str, fmt: str = "auto", tokenizer: str | None = None):
    """(Traffic, tokenizer or None) for `qwen3lab traffic`."""
    from qwen3lab.measure import workload as wl
    from qwen3lab.models import resolve_model_path
    from qwen3lab.traffic import sources
    from qwen3lab.traffic.spec import Source

    traffic = sources.load(Source(path=path, format=fmt))
    tok = wl.load_tokenizer(resolve_model_path(tokenizer)) if tokenizer else None
    return traffic, tok
