"""The spool: an append-only file next to a run's server log that every measured row reaches before DuckDB.

DuckDB can refuse a write (disk full, the file held by another program) and qwen3lab can be killed between a
measurement and its insert. So each batch of request rows and samples is appended here as one JSON line and
fsync'ed first; the run's final fields (status, summary) are appended last. Store.recover() ingests a spool
whose run was left `running` (skipping rows DuckDB already has), so what was measured reaches the database on
the next start. A line cut short by a kill is the only thing lost, and it was never acknowledged.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPOOL_NAME = "spool.jsonl"


@dataclass
class Spooled:
    """What a spool file holds: request rows, (t, source, name, value) samples, and the final fields if any."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    samples: list[tuple[float, str, str, float]] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    torn_lines: int = 0


class Spool:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def _append(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(entry, default=_jsonable, allow_nan=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())  # on disk before DuckDB is asked: that is the promise

    def add_requests(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._append({"kind": "requests", "rows": rows})

    def add_samples(self, samples: list[tuple[float, str, str, float]]) -> None:
        if samples:
            self._append({"kind": "samples", "rows": [list(s) for s in samples]})

    def finish(self, fields: dict[str, Any]) -> None:
        self._append({"kind": "finish", "fields": fields})

    def read(self) -> Spooled:
        out = Spooled()
        if not self.path.is_file():
            return out
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    out.torn_lines += 1  # the last line of a process killed while writing it
                    continue
                if entry.get("kind") == "requests":
                    out.requests += entry["rows"]
                elif entry.get("kind") == "samples":
                    out.samples += [tuple(s) for s in entry["rows"]]
                elif entry.get("kind") == "finish":
                    out.finish = entry["fields"]
        return out

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
