"""Replication: the demo's scheduler chapter measured N times, each into a fresh database, as a new user would
(`qwen3lab run experiments/cpu-tiny.yaml --only scheduler`), then `qwen3lab winner` on each. Target: never two
different confident winners; where the data cannot decide, every measurement says "can't tell".

    python bench/replication_bench.py --times 5                  # measure 5 times (about 12 min each on 2 cores)
    python bench/replication_bench.py --read rep-*.duckdb        # read measurements made earlier, measure nothing
    python bench/replication_bench.py --times 5 --dry-run        # print the commands, measure nothing
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen3lab.analysis import compare, wording  # noqa: E402
from qwen3lab.experiment import files as xp  # noqa: E402
from qwen3lab.store import Store  # noqa: E402

EXPERIMENT = ROOT / "experiments" / "cpu-tiny.yaml"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--times", type=int, default=5, help="How many fresh measurements of the chapter (default 5).")
    p.add_argument("--read", nargs="+", default=[], metavar="DB", help="Read these databases; measure nothing.")
    p.add_argument("--experiment", default=str(EXPERIMENT))
    p.add_argument("--chapter", default="scheduler")
    p.add_argument("--workdir", default="replication", help="Where the fresh databases and server logs go.")
    p.add_argument("--dry-run", action="store_true", help="Print the commands that would measure; run nothing.")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "replication_bench.json"))
    args = p.parse_args(argv)
    if args.times < 1:
        p.error(f"--times {args.times}: use 1 or more (5 for the issue's target)")
    return args


def command(args, i: int) -> list[str]:
    work = Path(args.workdir)
    return [sys.executable, "-m", "qwen3lab.cli", "run", args.experiment, "--only", args.chapter,
            "--db", str(work / f"rep-{i}.duckdb"), "--runs-dir", str(work / f"runs-{i}")]


def read(db: Path, experiment: str, chapter: str) -> dict:
    """One measurement's winner and verdict, as `qwen3lab winner --json` gives them."""
    store = Store(db)
    slo = compare.stored_slo(store, experiment)
    got = compare.winners(store, experiment, slo, chapter)
    if not got:
        return {"db": str(db), "winner": None, "verdict": "no ok runs"}
    v = wording.winner_json(got[0])
    verdict = v["verdict"] or ("no trial meets the SLOs" if v["winner"] is None else "the only trial meeting the SLOs")
    return {"db": str(db), "winner": v["winner"], "runner_up": v["runner_up"], "verdict": verdict,
            "confident": v["confident"], "margin": v["margin_goodput"], "would_take": v["would_take"],
            "launches": v["launches"], "line": wording.winner_line(got[0])}


def summarize(rows: list[dict]) -> dict:
    confident = sorted({r["winner"] for r in rows if r.get("confident")})
    return {"measurements": len(rows), "confident_winners": confident, "ok": len(confident) <= 1}


def main(argv=None) -> int:
    args = parse_args(argv)
    experiment = xp.load(args.experiment).name
    if args.read:
        dbs = [Path(d) for d in args.read]
    else:
        dbs = []
        for i in range(args.times):
            cmd = command(args, i)
            print(" ".join(cmd))
            if args.dry_run:
                continue
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            t0 = time.monotonic()
            subprocess.run(cmd, cwd=ROOT, check=True)
            print(f"measurement {i + 1}: {time.monotonic() - t0:.0f} s")
            dbs.append(Path(cmd[cmd.index("--db") + 1]))
        if args.dry_run:
            return 0
    rows = [read(db, experiment, args.chapter) for db in dbs]
    print(f"{'#':>2}  {'winner':<36} {'runner-up':<36} {'margin req/s (CI)':<28} verdict")
    for i, r in enumerate(rows, 1):
        m = r.get("margin") or {}
        margin = f"{m['estimate']:+.2f} ({m['low']:+.2f} .. {m['high']:+.2f})" if m else "-"
        print(f"{i:>2}  {str(r['winner']):<36} {str(r.get('runner_up')):<36} {margin:<28} {r['verdict']}")
    s = summarize(rows)
    print(f"confident winners: {s['confident_winners'] or 'none'}; target (never two different ones): "
          + ("ok" if s["ok"] else "MISSED"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows, "summary": s}, indent=2, default=str))
    print(f"wrote {out}")
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
