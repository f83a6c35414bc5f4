"""Copy a qwen3lab DuckDB without per-chunk timestamps, so a measured history is small enough to commit.

    python tools/slim_db.py SRC.duckdb DST.duckdb

Every table and row is copied as stored, but `requests.chunk_times` (one timestamp per streamed chunk: most of
a file's size) is left empty; TTFT, E2EL, token counts and every summary stay. TPOT and ITL per request are
recomputed from E2EL and the tokens where chunk times are absent, so the dashboard and history still read.
DuckDB does not shrink a file when rows are changed in place, hence a copy into a fresh file.
"""
import sys
from pathlib import Path

import duckdb

src, dst = sys.argv[1:3]
Path(dst).unlink(missing_ok=True)
con = duckdb.connect(dst)
con.execute(f"ATTACH '{src}' AS src (READ_ONLY)")
for (table,) in con.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = 'src'").fetchall():
    con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
con.execute("UPDATE requests SET chunk_times = NULL")
con.execute("DETACH src")
con.execute("CHECKPOINT")
con.close()
print(f"{dst}: {Path(dst).stat().st_size / 2**20:.1f} MiB (from {Path(src).stat().st_size / 2**20:.1f} MiB)")
