"""RunSink: where a run's rows go while it is measured, written down as a typing.Protocol.

runner (a launch, a capacity point, a soak window) writes through a RunSink and reads back only its own rows.
Two implement it: store.Store (DuckDB, on the machine that runs the launch) and measure/ray_worker.Relay (on a
Ray node: each write becomes an event the driver replays into its Store). What differs between them is said
by two attributes, not by the type: how often the runner hands rows over during a load, and whether the run's
spool must outlive the run here (the Relay's rows are in DuckDB only once the driver replays them).
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from qwen3lab.store import Claim, Owner


@runtime_checkable
class RunSink(Protocol):
    flush_every_s: float  # rows are handed over every so many seconds during a load (each write stalls the client)
    keeps_spool: bool  # True: the run's spool stays after the run (its rows are not safe here yet)

    def begin_run(self, **fields: Any) -> str:
        """A run row (status running unless `fields` say otherwise); its id."""

    def claim_run(self, trial_key: str, since: datetime, owner: Owner, **fields: Any) -> Claim:
        """The run row, unless another live qwen3lab holds the trial (Claim.held_by)."""

    def heartbeat(self, run_id: str) -> None: ...

    def update_run(self, run_id: str, **fields: Any) -> None: ...

    def finish_run(self, run_id: str, status: str, reason: str | None = None, summary: dict | None = None,
                   **fields: Any) -> None: ...

    def add_requests(self, run_id: str, records: Sequence[Any]) -> None: ...

    def add_samples(self, run_id: str, samples: Sequence[tuple[float, str, str, float]]) -> None: ...

    def requests(self, run_ids: Sequence[str], measured_only: bool = True, with_chunks: bool = True):
        """The run's request rows as a DataFrame (the summary is computed from them)."""

    def samples(self, run_ids: Sequence[str], source: str | None = None):
        """The run's (t, source, name, value) samples as a DataFrame (a capacity point's queue trend reads them)."""

    def ingest_spool(self, run_id: str, path: Any) -> Any:
        """Rows a refused write left in the run's spool, stored now."""

    def begin_capacity(self, **fields: Any) -> str: ...

    def finish_capacity(self, search_id: str, status: str, reason: str | None = None, **fields: Any) -> None: ...
