"""`qwen3lab traffic`'s table (rich): presentation only, the figures come from traffic.shape."""
from __future__ import annotations

from rich.table import Table


def traffic_table(summary: dict) -> Table:
    """`qwen3lab traffic`: one row per figure of a traffic file."""
    t = Table(title=f"{summary['path']} ({summary['format']}, digest {summary['digest']})")
    t.add_column("what")
    t.add_column("value", overflow="fold")
    rate = summary.get("rate") or {}
    rows = [("requests", summary["requests"]), ("rows skipped (0 tokens)", summary["skipped_rows"]),
            ("duration s", summary["duration_s"]), ("mean rate /s", rate.get("mean_per_s")),
            ("rate /s over time", " ".join(f"{x:.2g}" for x in rate.get("per_s", [])) or None)]
    for key in ("prompt_tokens", "output_tokens", "turns_per_session"):
        if p := summary.get(key):
            rows.append((key, ", ".join(f"{k} {v:.4g}" for k, v in p.items())))
    rows += [("sessions", summary.get("sessions")), ("prefix reuse", summary.get("prefix_reuse"))]
    for what, value in rows:
        if value is not None:
            t.add_row(what, str(value))
    return t
