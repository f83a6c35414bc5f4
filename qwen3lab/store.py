"""The DuckDB store: the only code that speaks SQL. Schema, migrations, and named queries.

DuckDB lets one process write a file at a time, and a reader cannot open it while a writer holds it. So every
call opens the file, does one short transaction, and closes it; a call that meets another process's lock
waits and retries. That is what lets the dashboard read while a sweep writes.

Lines: over 450 because the schema, the writes, the owner/claim/recovery of running rows and the named
queries are all SQL, and this is the only module that may speak it.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from qwen3lab.errors import Qwen3LabError
from qwen3lab.spool import Spool

DEFAULT_DB = "qwen3lab.duckdb"
# Threads of a process share DuckDB's database instance of a file, and one thread opening a connection while
# another closes the last one fails (seen in a sweep: "Table Function with name python_arrow_scan does not
# exist" when the request flusher and the runner wrote together). So opening, closing and migrating take this
# per-file lock; queries on open connections still run side by side. Other processes are kept apart by
# DuckDB's file lock (see connect).
_FILE_LOCKS: dict[str, threading.RLock] = {}
_FILE_LOCKS_GUARD = threading.Lock()
# How long a write waits for another process's lock before it gives up (the fault tests shorten it).
LOCK_WAIT_S = float(os.environ.get("QWEN3LAB_LOCK_WAIT_S", "30"))

# Key figures copied out of the summary into columns, so listing runs needs no JSON parsing.
SUMMARY_COLUMNS = (
    "completed", "failed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
    "request_goodput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p95_tpot_ms",
    "median_itl_ms", "p99_e2el_ms",
)

MIGRATIONS: list[str] = [
    # 1: runs, requests, samples
    """
    CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY,
        trial_key VARCHAR, experiment VARCHAR, chapter VARCHAR, trial VARCHAR, baseline VARCHAR,
        status VARCHAR NOT NULL, reason VARCHAR,
        engine_kind VARCHAR, model VARCHAR, config_json VARCHAR, config_hash VARCHAR,
        workload_json VARCHAR, slo_json VARCHAR, tags_json VARCHAR,
        launch_command VARCHAR, exec_argv_json VARCHAR, env_json VARCHAR,
        vllm_version VARCHAR, torch_version VARCHAR, python_executable VARCHAR,
        git_commit VARCHAR, experiment_path VARCHAR, host VARCHAR, cpu VARCHAR, gpu VARCHAR,
        started_at TIMESTAMPTZ, ended_at TIMESTAMPTZ, log_path VARCHAR, notebook_path VARCHAR,
        requests_digest VARCHAR, tokenizer_fingerprint VARCHAR,
        planner_kv_tokens BIGINT, vllm_kv_tokens BIGINT, peak_gpu_memory_mib DOUBLE,
        client_cpu_s DOUBLE, summary_json VARCHAR, info_json VARCHAR,
        completed INTEGER, failed INTEGER, duration DOUBLE, request_throughput DOUBLE, output_throughput DOUBLE,
        total_token_throughput DOUBLE, request_goodput DOUBLE, median_ttft_ms DOUBLE, p95_ttft_ms DOUBLE,
        p99_ttft_ms DOUBLE, median_tpot_ms DOUBLE, p95_tpot_ms DOUBLE, median_itl_ms DOUBLE, p99_e2el_ms DOUBLE
    );
    CREATE TABLE requests (
        run_id VARCHAR NOT NULL, idx INTEGER NOT NULL, request_class VARCHAR, warmup BOOLEAN,
        shared_prefix BOOLEAN, prompt_tokens_target INTEGER, output_tokens_target INTEGER,
        prompt_tokens INTEGER, output_tokens INTEGER, sent_at DOUBLE, ttft DOUBLE, e2el DOUBLE,
        chunk_times DOUBLE[], status INTEGER, error VARCHAR
    );
    CREATE TABLE samples (
        run_id VARCHAR NOT NULL, t DOUBLE NOT NULL, source VARCHAR NOT NULL, name VARCHAR NOT NULL, value DOUBLE
    );
    """,
    # 2: what a run may be compared with, and why its measurement cannot be trusted (NULL: it can)
    """
    ALTER TABLE runs ADD COLUMN comparability_key VARCHAR;
    ALTER TABLE runs ADD COLUMN validity VARCHAR;
    ALTER TABLE runs ADD COLUMN checks_json VARCHAR;
    """,
    # 3: which server of a split topology answered each request (the router's x-qwen3lab-route header)
    "ALTER TABLE requests ADD COLUMN route VARCHAR;",
    # 4: capacity searches: each load point is a run linked to its search; one row per search with the result;
    # each run's server start (process start to /health, seconds; for a capacity point, its server's) and
    # whether torch.compile's cache was warm
    """
    ALTER TABLE runs ADD COLUMN search_id VARCHAR;
    ALTER TABLE runs ADD COLUMN point_index INTEGER;
    ALTER TABLE runs ADD COLUMN load_axis VARCHAR;
    ALTER TABLE runs ADD COLUMN offered_load DOUBLE;
    ALTER TABLE runs ADD COLUMN attainment DOUBLE;
    ALTER TABLE runs ADD COLUMN point_verdict VARCHAR;
    ALTER TABLE runs ADD COLUMN start_s DOUBLE;
    ALTER TABLE runs ADD COLUMN compile_cache VARCHAR;
    CREATE TABLE capacities (
        search_id VARCHAR PRIMARY KEY, trial_key VARCHAR, experiment VARCHAR, chapter VARCHAR, trial VARCHAR,
        config_hash VARCHAR, axis VARCHAR, criterion VARCHAR, min_attainment DOUBLE, tolerance DOUBLE,
        status VARCHAR NOT NULL, reason VARCHAR, capacity DOUBLE, low DOUBLE, high DOUBLE, points INTEGER,
        server_starts INTEGER, start_s DOUBLE, measure_s DOUBLE, started_at TIMESTAMPTZ, ended_at TIMESTAMPTZ,
        spec_json VARCHAR
    );
    """,
    # 5: adaptive searches over launch flags: one row per suggested configuration, pruned and failed ones too
    """
    CREATE TABLE search_trials (
        study VARCHAR NOT NULL, number INTEGER NOT NULL, experiment VARCHAR, trial_key VARCHAR, trial VARCHAR,
        params_json VARCHAR, state VARCHAR NOT NULL, value DOUBLE, value2 DOUBLE, low DOUBLE, high DOUBLE,
        reason VARCHAR, run_id VARCHAR, search_id VARCHAR, config_hash VARCHAR, wall_s DOUBLE,
        started_at TIMESTAMPTZ, ended_at TIMESTAMPTZ
    );
    """,
    # 6: who runs a `running` row (pid, host, that process's start time: a reused pid is another process),
    # its heartbeat, and the spool its rows reach first (see recover)
    """
    ALTER TABLE runs ADD COLUMN owner_pid INTEGER;
    ALTER TABLE runs ADD COLUMN owner_host VARCHAR;
    ALTER TABLE runs ADD COLUMN owner_started DOUBLE;
    ALTER TABLE runs ADD COLUMN heartbeat_at TIMESTAMPTZ;
    ALTER TABLE runs ADD COLUMN spool_path VARCHAR;
    """,
    # 7: soaks: one server kept under load for hours; each window of it is a run linked to its soak; one row
    # per soak with its counts (server starts, crashes, OOMs) and the drift of its last window against its first
    """
    ALTER TABLE runs ADD COLUMN soak_id VARCHAR;
    ALTER TABLE runs ADD COLUMN soak_window INTEGER;
    ALTER TABLE runs ADD COLUMN server_rss_mib DOUBLE;
    CREATE TABLE soaks (
        soak_id VARCHAR PRIMARY KEY, trial_key VARCHAR, experiment VARCHAR, chapter VARCHAR, trial VARCHAR,
        config_hash VARCHAR, status VARCHAR NOT NULL, reason VARCHAR, duration_s DOUBLE, window_s DOUBLE,
        max_restarts INTEGER, windows INTEGER, server_starts INTEGER, crashes INTEGER, ooms INTEGER,
        elapsed_s DOUBLE, drift_json VARCHAR, started_at TIMESTAMPTZ, ended_at TIMESTAMPTZ
    );
    """,
    # 8: the objectives of a search's study on each of its rows ("capacity,p95_ttft_ms"): a reader of the
    # rows alone (the dashboard) knows what value2 is and which way each is better, so it can draw the front
    "ALTER TABLE search_trials ADD COLUMN objectives VARCHAR;",
    # 9: the attention backend and FlashAttention version vLLM says it ran (its log), beside the one asked for
    """
    ALTER TABLE runs ADD COLUMN attention_backend VARCHAR;
    ALTER TABLE runs ADD COLUMN flash_attn_version INTEGER;
    """,
    # 10: a capacity point's steady-state verdict (measure.loadpoint.assess): offered and served rate, window,
    # queue trends, what failed, transient; and the verdict's reason in words
    """
    ALTER TABLE runs ADD COLUMN steady_json VARCHAR;
    ALTER TABLE runs ADD COLUMN point_why VARCHAR;
    """,
    # 11: campaigns (qwen3lab/campaign.py): one row per `run`, `sweep` or `capacity` invocation (or a workbook
    # chapter run by hand), written before its first server and finished after; runs and capacity searches
    # name the campaign that measured them
    """
    CREATE TABLE campaigns (
        campaign_id VARCHAR PRIMARY KEY, command VARCHAR, experiment VARCHAR, experiment_path VARCHAR,
        experiment_digest VARCHAR, params_json VARCHAR, qwen3lab_commit VARCHAR, host VARCHAR, driver VARCHAR,
        builds_json VARCHAR, notebooks_dir VARCHAR, notebooks_json VARCHAR, status VARCHAR NOT NULL,
        reason VARCHAR, owner_pid INTEGER, owner_host VARCHAR, owner_started DOUBLE, started_at TIMESTAMPTZ,
        ended_at TIMESTAMPTZ
    );
    ALTER TABLE runs ADD COLUMN campaign_id VARCHAR;
    ALTER TABLE capacities ADD COLUMN campaign_id VARCHAR;
    """,
    # 12: a traffic file's conversation and turn of each request (qwen3lab.traffic.conversations)
    """
    ALTER TABLE requests ADD COLUMN session VARCHAR;
    ALTER TABLE requests ADD COLUMN turn INTEGER;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)
REQUEST_COLUMNS = ("run_id", "idx", "request_class", "warmup", "shared_prefix", "prompt_tokens_target",
                   "output_tokens_target", "prompt_tokens", "output_tokens", "sent_at", "ttft", "e2el",
                   "chunk_times", "status", "error", "route", "session", "turn")


# A `running` row's owner on this host is alive while its pid runs with the same start time; an owner on
# another host (a shared file system) is judged by its heartbeat, written every HEARTBEAT_S: a DuckDB write
# (a connection opened and closed, a checkpoint) while the load runs costs the client ~10-30 ms of CPU, so
# no more often than four times inside STALE_AFTER_S.
HEARTBEAT_S = 30.0
STALE_AFTER_S = 120.0


class StoreError(Qwen3LabError):
    pass


@dataclass(frozen=True)
class Owner:
    """The process that runs a trial."""

    pid: int
    host: str
    started: float  # the process's start time (psutil create_time)

    @classmethod
    def me(cls) -> "Owner":
        import psutil

        return cls(os.getpid(), socket.gethostname(), psutil.Process().create_time())

    def fields(self) -> dict[str, Any]:
        return {"owner_pid": self.pid, "owner_host": self.host, "owner_started": self.started}

    def owns(self, row: dict[str, Any]) -> bool:
        started = row.get("owner_started")
        return (row.get("owner_pid") == self.pid and row.get("owner_host") == self.host
                and not _missing(started) and abs(float(started) - self.started) < 1.0)


def owner_alive(row: dict[str, Any]) -> bool:
    """Whether the process that holds a `running` row still runs (a row without an owner: by its age)."""
    import psutil

    pid, host, started = row.get("owner_pid"), row.get("owner_host"), row.get("owner_started")
    if pid is not None and not _missing(pid) and host == socket.gethostname():
        try:
            proc = psutil.Process(int(pid))
            return abs(proc.create_time() - float(started)) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied, TypeError, ValueError):
            return False
    beat = row.get("heartbeat_at")
    beat = row.get("started_at") if _missing(beat) else beat
    if _missing(beat):
        return False
    return (now() - beat.to_pydatetime() if hasattr(beat, "to_pydatetime") else now() - beat).total_seconds() \
        < STALE_AFTER_S


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value) or str(value) in ("NaT", "<NA>")


@dataclass
class Claim:
    """What claim_run found: the new run's id, or the run that holds (or just finished) the trial."""

    run_id: str | None
    held_by: dict[str, Any] | None = None

    @property
    def reason(self) -> str:
        h = self.held_by or {}
        if h.get("status") == "running":
            return (f"held by run {h.get('run_id')} (qwen3lab pid {h.get('owner_pid')} on {h.get('owner_host')}, "
                    "still running): not run twice")
        return f"run {h.get('run_id')} of another qwen3lab finished it meanwhile ({h.get('status')}): not run twice"


def now() -> datetime:
    return datetime.now(timezone.utc)


class Store:
    """A DuckDB file; the RunSink (sink.py) a run writes through when it runs where the file is."""

    flush_every_s = 30.0  # each write during a load stalls the client that times the streams: long loads only
    keeps_spool = False  # a run's rows are here once written: its spool goes when it ends

    def __init__(self, path: str | os.PathLike = DEFAULT_DB):
        self.path = str(Path(path).expanduser())
        self._migrated = False

    # --- connections ----------------------------------------------------------------------------------
    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[Any]:
        import duckdb

        with _FILE_LOCKS_GUARD:
            lock = _FILE_LOCKS.setdefault(os.path.realpath(self.path), threading.RLock())
        if read_only and not Path(self.path).exists():
            raise StoreError(f"no database at {self.path}: run an experiment first (qwen3lab run ...) or pass --db")
        if not read_only and not self._migrated:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        reading = read_only
        deadline = time.monotonic() + LOCK_WAIT_S
        delay = 0.02
        while True:
            try:
                with lock:
                    con = duckdb.connect(self.path, read_only=read_only)
                break
            except duckdb.ConnectionException as exc:
                # Another thread of this process has the file open in the other mode. A reader reads through
                # the writer's mode; a writer waits for the reader to finish, as it would for another process.
                if "different configuration" not in str(exc) or time.monotonic() > deadline:
                    raise StoreError(f"cannot open {self.path}: {exc}") from exc
                if read_only:
                    read_only = False
                    continue
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                    raise StoreError(f"cannot open {self.path}: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        try:
            if not read_only and not self._migrated and not reading:
                with lock:  # two Stores of this process opening a new file migrate one after the other
                    self._migrate(con)
            yield con
        finally:
            with lock:
                con.close()

    def _migrate(self, con) -> None:
        con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER, applied_at TIMESTAMPTZ)")
        # fetchall, not fetchone: DuckDB 2 refuses other work (register) on a connection with an unfinished result
        have = con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchall()[0][0]
        if have > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema v{have}, newer than this qwen3lab (v{SCHEMA_VERSION}): upgrade qwen3lab")
        for version in range(have + 1, SCHEMA_VERSION + 1):
            con.execute("BEGIN")
            if con.execute("SELECT count(*) FROM schema_version WHERE version = ?", [version]).fetchall()[0][0]:
                con.execute("ROLLBACK")  # another Store in this process got there first
                continue
            con.execute(MIGRATIONS[version - 1])
            con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, now()])
            con.execute("COMMIT")
        self._migrated = True

    def schema_version(self) -> int:
        with self.connect() as con:
            return con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0]

    # --- writing a run --------------------------------------------------------------------------------
    def begin_run(self, **fields: Any) -> str:
        """Insert the run row (status running) before anything is launched; returns its id."""
        run_id = fields.pop("run_id", None) or new_run_id()
        fields.setdefault("status", "running")
        fields.setdefault("started_at", now())
        cols = ["run_id", *fields]
        with self.connect() as con:
            con.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                        [run_id, *(_sql_value(v) for v in fields.values())])
        return run_id

    def claim_run(self, trial_key: str, since: datetime, owner: Owner, **fields: Any) -> Claim:
        """Begin a run of a trial unless another live qwen3lab holds it, or started or finished it since `since`
        (when the caller looked for earlier runs): two sweeps on one file never run one trial twice. A run cut
        short (interrupted, lost) is run again; this process's own finished runs (earlier repeats) do not count.

        One transaction on a file DuckDB lets one process write at a time, so the look and the insert are one step.
        """
        self.recover(trial_key)
        run_id = fields.pop("run_id", None) or new_run_id()
        fields |= owner.fields() | {"status": "running", "started_at": now(), "heartbeat_at": now()}
        cols = ["run_id", "trial_key", *fields]
        with self.connect() as con:
            con.execute("BEGIN")
            cur = con.execute("SELECT * FROM runs WHERE trial_key = ? AND (status = 'running' OR started_at >= ? "
                              "OR (ended_at >= ? AND status NOT IN ('interrupted', 'lost'))) ORDER BY started_at DESC",
                              [trial_key, since, since])
            names = [d[0] for d in cur.description]
            for row in (dict(zip(names, r)) for r in cur.fetchall()):
                if row["status"] != "running" and owner.owns(row):
                    continue  # this process's own earlier launch (repeats): not another qwen3lab's
                if row["status"] != "running" or owner_alive(row):
                    con.execute("ROLLBACK")
                    return Claim(None, row)
            con.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                        [run_id, trial_key, *(_sql_value(v) for v in fields.values())])
            con.execute("COMMIT")
        return Claim(run_id)

    def heartbeat(self, run_id: str) -> None:
        with self.connect() as con:
            con.execute("UPDATE runs SET heartbeat_at = ? WHERE run_id = ? AND status = 'running'", [now(), run_id])

    def recover(self, trial_key: str | None = None) -> list[dict[str, Any]]:
        """`running` rows whose owner is gone: their spool ingested, then finished as the spool says (the run
        ended but DuckDB refused its last write) or `interrupted` (resume runs those again). Returns them."""
        if not Path(self.path).exists():
            return []
        extra, params = ("AND trial_key = ?", [trial_key]) if trial_key else ("", [])
        with self.connect() as con:
            cur = con.execute(f"SELECT run_id, owner_pid, owner_host, owner_started, heartbeat_at, started_at, "
                              f"spool_path FROM runs WHERE status = 'running' {extra}", params)
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r)) for r in cur.fetchall()]
        recovered = []
        for row in rows:
            if owner_alive(row):
                continue
            spooled = self.ingest_spool(row["run_id"], row["spool_path"]) if row.get("spool_path") else None
            n = spooled.requests_added if spooled else 0
            if spooled and spooled.finish:
                fields = dict(spooled.finish)
                fields["ended_at"] = datetime.fromisoformat(fields["ended_at"]) if fields.get("ended_at") else now()
                self.update_run(row["run_id"], **fields)
                status = fields.get("status")
            else:
                beat = row.get("heartbeat_at") or row.get("started_at")
                status = "interrupted"
                who = (f"qwen3lab (pid {row['owner_pid']} on {row.get('owner_host')})" if row.get("owner_pid")
                       else "the qwen3lab that began it (a version that stored no owner)")
                self.finish_run(row["run_id"], status, f"{who} stopped without "
                                f"finishing the run (killed?); last heartbeat {beat}; {n} measured requests were "
                                "recovered from its spool")
            Spool(row["spool_path"]).remove() if row.get("spool_path") else None
            recovered.append({"run_id": row["run_id"], "status": status, "requests_recovered": n})
        return recovered

    def ingest_spool(self, run_id: str, path: str | os.PathLike) -> "IngestResult":
        """Store what a run's spool holds that DuckDB does not have yet (by request index; samples by t, source, name)."""
        spooled = Spool(path).read()
        have = self._query("SELECT idx FROM requests WHERE run_id = ?", [run_id])
        known = set() if have is None else set(int(i) for i in have.idx)
        rows = [r for r in spooled.requests if int(r["idx"]) not in known]
        self.add_requests(run_id, rows)
        got = self._query("SELECT t, source, name FROM samples WHERE run_id = ?", [run_id])
        seen = set() if got is None else set(zip(got.t, got.source, got.name))
        self.add_samples(run_id, [s for s in spooled.samples if (s[0], s[1], s[2]) not in seen])
        return IngestResult(len(rows), spooled.finish)

    def update_run(self, run_id: str, **fields: Any) -> None:
        if not fields:
            return
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self.connect() as con:
            con.execute(f"UPDATE runs SET {sets} WHERE run_id = ?", [*(_sql_value(v) for v in fields.values()), run_id])

    def finish_run(self, run_id: str, status: str, reason: str | None = None,
                   summary: dict | None = None, **fields: Any) -> None:
        self.update_run(run_id, **finish_fields(status, reason, summary, **fields))

    def add_requests(self, run_id: str, records: Sequence[Any]) -> None:
        """Append request records (loadgen.RequestRecord or dicts with the same fields)."""
        if not records:
            return
        import pyarrow as pa

        rows = [r if isinstance(r, dict) else request_row(r) for r in records]
        table = pa.table({c: [row.get(c, run_id) if c == "run_id" else row.get(c) for row in rows]
                          for c in REQUEST_COLUMNS},
                         schema=_request_schema())
        with self.connect() as con:
            con.register("incoming", table)
            con.execute(f"INSERT INTO requests SELECT {', '.join(REQUEST_COLUMNS)} FROM incoming")

    def add_samples(self, run_id: str, samples: Sequence[tuple[float, str, str, float]]) -> None:
        """Append (t, source, name, value) samples."""
        if not samples:
            return
        import pyarrow as pa

        t, source, name, value = zip(*samples)
        table = pa.table({"run_id": [run_id] * len(t), "t": list(t), "source": list(source),
                          "name": list(name), "value": [float(v) for v in value]})
        with self.connect() as con:
            con.register("incoming", table)
            con.execute("INSERT INTO samples SELECT run_id, t, source, name, value FROM incoming")

    def delete_runs(self, run_ids: Sequence[str]) -> None:
        with self.connect() as con:
            for table in ("samples", "requests", "runs"):
                con.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT unnest(?))", [list(run_ids)])

    # --- named queries --------------------------------------------------------------------------------
    def _query(self, sql: str, params: Sequence[Any] = ()):
        import duckdb

        if not Path(self.path).exists():
            return None
        with self.connect(read_only=True) as con:
            try:
                return con.execute(sql, list(params)).df()
            except duckdb.CatalogException:
                return None  # the file exists but its first write (the schema) has not landed yet

    def runs(self, experiment: str | None = None, chapter: str | None = None, status: str | None = None,
             run_ids: Sequence[str] | None = None, with_json: bool = False):
        """Runs as a pandas DataFrame, newest first (empty when there is no database yet)."""
        import pandas as pd

        where, params = [], []
        for col, val in (("experiment", experiment), ("chapter", chapter), ("status", status)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        if run_ids is not None:
            where.append("run_id IN (SELECT unnest(?))")
            params.append(list(run_ids))
        drop = () if with_json else ("summary_json", "info_json", "config_json", "workload_json", "exec_argv_json",
                                     "checks_json")
        # a lambda, not EXCLUDE: a file of an older schema (opened read-only, not migrated) lacks newer columns
        cols = "*" if with_json else "COLUMNS(lambda c: c NOT IN (" + ", ".join(f"'{c}'" for c in drop) + "))"
        # the steady-state TTFT p95 (a closed loop's opening burst left out) lives in the summary: columns here
        steady = ", ".join(f"TRY_CAST(json_extract(summary_json, '$.{k}') AS DOUBLE) AS {k}"
                           for k in ("steady_p95_ttft_ms", "opening_burst_requests"))
        sql = (f"SELECT {cols}, {steady} FROM runs {'WHERE ' + ' AND '.join(where) if where else ''} "
               "ORDER BY started_at DESC")
        df = self._query(sql, params)
        return df if df is not None else pd.DataFrame()

    def run(self, run_id: str) -> dict[str, Any]:
        if not Path(self.path).exists():
            raise StoreError(f"no database at {self.path}: run an experiment first (qwen3lab run ...) or pass --db")
        df = self.runs(run_ids=[run_id], with_json=True)
        if df.empty:
            raise StoreError(f"no run {run_id!r} in {self.path}: list them with `qwen3lab runs`")
        row = df.iloc[0].to_dict()
        for key in ("summary_json", "info_json", "config_json", "workload_json", "slo_json", "tags_json",
                    "exec_argv_json", "env_json", "checks_json"):
            if row.get(key):
                row[key.removesuffix("_json")] = json.loads(row[key])
        return row

    def requests(self, run_ids: Sequence[str], measured_only: bool = True, with_chunks: bool = True):
        # chunk_count: the output-token count of a request whose server sent no usage (metrics' rule)
        cols = "*, len(chunk_times) AS chunk_count" if with_chunks else "* EXCLUDE (chunk_times), len(chunk_times) AS chunk_count"
        warm = "AND NOT warmup" if measured_only else ""
        df = self._query(f"SELECT {cols} FROM requests WHERE run_id IN (SELECT unnest(?)) {warm} ORDER BY run_id, idx",
                         [list(run_ids)])
        return df

    def request_counts(self, run_ids: Sequence[str]) -> dict[str, int]:
        df = self._query("SELECT run_id, count(*) AS n FROM requests WHERE run_id IN (SELECT unnest(?)) "
                         "AND NOT warmup GROUP BY run_id", [list(run_ids)])
        return {} if df is None else dict(zip(df.run_id, df.n))

    def samples(self, run_ids: Sequence[str], source: str | None = None):
        extra, params = ("AND source = ?", [source]) if source else ("", [])
        return self._query(f"SELECT * FROM samples WHERE run_id IN (SELECT unnest(?)) {extra} ORDER BY run_id, t",
                           [list(run_ids), *params])

    def trial_runs(self, trial_key: str):
        """The launches of a trial, oldest first: not the load points or windows that share its key (selection)."""
        return self._query("SELECT run_id, trial_key, status, reason, started_at FROM runs WHERE trial_key = ? "
                           "AND search_id IS NULL AND soak_id IS NULL ORDER BY started_at", [trial_key])

    # --- capacity searches, adaptive searches, soaks: one row each, written as they go ------------------------
    def _insert(self, table: str, fields: dict[str, Any]) -> None:
        cols = list(fields)
        with self.connect() as con:
            con.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                        [_sql_value(v) for v in fields.values()])

    def _update(self, table: str, key: dict[str, Any], fields: dict[str, Any]) -> None:
        sets = ", ".join(f"{k} = ?" for k in fields)
        where = " AND ".join(f"{k} = ?" for k in key)
        with self.connect() as con:
            con.execute(f"UPDATE {table} SET {sets} WHERE {where}",
                        [*(_sql_value(v) for v in fields.values()), *key.values()])

    def _select(self, table: str, order: str, **equal: Any):
        """Rows of `table` whose columns equal the given values (None: any), in `order` (empty when none)."""
        import pandas as pd

        where = [(col, val) for col, val in equal.items() if val is not None]
        sql = f"SELECT * FROM {table} {'WHERE ' + ' AND '.join(f'{c} = ?' for c, _ in where) if where else ''}"
        df = self._query(f"{sql} ORDER BY {order}", [v for _, v in where])
        return df if df is not None else pd.DataFrame()

    def _linked_runs(self, column: str, ids: Sequence[str], order: str):
        """The runs that are pieces of larger measurements (a search's load points, a soak's windows)."""
        import pandas as pd

        df = self._query("SELECT * EXCLUDE (summary_json, info_json, config_json, workload_json, exec_argv_json) "
                         f"FROM runs WHERE {column} IN (SELECT unnest(?)) ORDER BY {column}, {order}", [list(ids)])
        return df if df is not None else pd.DataFrame()

    def begin_capacity(self, **fields: Any) -> str:
        """Insert a capacity search's row (status running) before its server starts; returns its id."""
        search_id = fields.pop("search_id", None) or "cap-" + new_run_id()
        self._insert("capacities", {"search_id": search_id, **fields, "status": "running", "started_at": now()})
        return search_id

    def finish_capacity(self, search_id: str, status: str, reason: str | None = None, **fields: Any) -> None:
        self._update("capacities", {"search_id": search_id},
                     fields | {"status": status, "reason": reason, "ended_at": now()})

    def capacities(self, experiment: str | None = None, trial_key: str | None = None):
        """Capacity searches, newest first (empty when none were run)."""
        return self._select("capacities", "started_at DESC", experiment=experiment, trial_key=trial_key)

    def capacity_points(self, search_ids: Sequence[str]):
        """The load points (runs) of capacity searches, in the order they were measured."""
        return self._linked_runs("search_id", search_ids, "point_index")

    def add_search_trial(self, **fields: Any) -> None:
        self._insert("search_trials", {"started_at": now(), **fields})

    def finish_search_trial(self, study: str, number: int, state: str, **fields: Any) -> None:
        self._update("search_trials", {"study": study, "number": number},
                     fields | {"state": state, "ended_at": now()})

    def search_trials(self, study: str | None = None, experiment: str | None = None):
        """A search's suggestions in the order they were made (empty when none)."""
        return self._select("search_trials", "study, number", study=study, experiment=experiment)

    def begin_soak(self, **fields: Any) -> str:
        """Insert a soak's row (status running) before its server starts; returns its id."""
        soak_id = fields.pop("soak_id", None) or "soak-" + new_run_id()
        self._insert("soaks", {"soak_id": soak_id, **fields, "status": "running", "started_at": now()})
        return soak_id

    def update_soak(self, soak_id: str, **fields: Any) -> None:
        self._update("soaks", {"soak_id": soak_id}, fields)

    def soaks(self, experiment: str | None = None, soak_id: str | None = None):
        """Soaks, newest first (empty when none were run)."""
        return self._select("soaks", "started_at DESC", experiment=experiment, soak_id=soak_id)

    def soak_windows(self, soak_ids: Sequence[str]):
        """The windows (runs) of soaks, in the order they were measured."""
        return self._linked_runs("soak_id", soak_ids, "soak_window")

    # --- campaigns: one row per invocation (qwen3lab/campaign.py) ---------------------------------------------
    def begin_campaign(self, campaign_id: str, **fields: Any) -> str:
        self._insert("campaigns", {"campaign_id": campaign_id, **fields, "status": "running", "started_at": now()})
        return campaign_id

    def finish_campaign(self, campaign_id: str, status: str, reason: str | None = None, **fields: Any) -> None:
        """The campaign's end, with the vLLM/torch builds its runs met (as they were stored)."""
        met = self._query("SELECT DISTINCT vllm_version, torch_version, python_executable FROM runs WHERE "
                          "campaign_id = ? AND vllm_version IS NOT NULL ORDER BY ALL", [campaign_id])
        builds = [] if met is None else met.to_dict("records")
        self._update("campaigns", {"campaign_id": campaign_id},
                     {"builds_json": builds, "ended_at": now()} | fields | {"status": status, "reason": reason})

    def campaigns(self, experiment: str | None = None, status: str | None = None):
        """Campaigns, oldest first (empty when none, or a file older than campaigns)."""
        return self._select("campaigns", "started_at", experiment=experiment, status=status)

    def experiments(self) -> list[str]:
        df = self._query("SELECT DISTINCT experiment FROM runs WHERE experiment IS NOT NULL ORDER BY 1")
        return [] if df is None else list(df.experiment)


def finish_fields(status: str, reason: str | None = None, summary: dict | None = None, **fields: Any) -> dict:
    """The columns a finished run row gets (the summary's key figures copied out)."""
    fields |= {"status": status, "reason": reason, "ended_at": now()}
    if summary is not None:
        fields["summary_json"] = summary
        fields |= {k: summary.get(k) for k in SUMMARY_COLUMNS}
    return fields


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def _sql_value(v: Any) -> Any:
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, sort_keys=True, default=str)
    return v


@dataclass
class IngestResult:
    requests_added: int
    finish: dict[str, Any] | None


def request_row(r: Any) -> dict[str, Any]:
    """A loadgen.RequestRecord as a row of the requests table (without run_id)."""
    return record_row(r)


def record_row(r: Any) -> dict[str, Any]:
    return {
        "idx": r.index, "request_class": r.request_class, "warmup": r.warmup, "shared_prefix": r.shared_prefix,
        "prompt_tokens_target": r.prompt_tokens_target, "output_tokens_target": r.output_tokens_target,
        "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "sent_at": r.sent_at,
        "ttft": r.ttft, "e2el": r.e2el, "chunk_times": list(r.chunk_times), "status": r.status, "error": r.error,
        "route": getattr(r, "route", None), "session": getattr(r, "session", None), "turn": getattr(r, "turn", None),
    }


def _request_schema():
    import pyarrow as pa

    return pa.schema([
        ("run_id", pa.string()), ("idx", pa.int32()), ("request_class", pa.string()), ("warmup", pa.bool_()),
        ("shared_prefix", pa.bool_()), ("prompt_tokens_target", pa.int32()), ("output_tokens_target", pa.int32()),
        ("prompt_tokens", pa.int32()), ("output_tokens", pa.int32()), ("sent_at", pa.float64()),
        ("ttft", pa.float64()), ("e2el", pa.float64()), ("chunk_times", pa.list_(pa.float64())),
        ("status", pa.int32()), ("error", pa.string()), ("route", pa.string()), ("session", pa.string()),
        ("turn", pa.int32()),
    ])
