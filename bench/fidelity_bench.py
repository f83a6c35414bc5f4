"""Fidelity: the figures `qwen3lab run` stores against `vllm bench serve`'s, on the same server, as users run them.

Endpoint path: one vLLM server started by hand (its module, vLLM's defaults, log to a file), then rounds that
alternate `qwen3lab run` of a `kind: endpoint` experiment (the real CLI, a subprocess, a fresh DuckDB each
round) with `vllm bench serve` (its module through bench/vllm_bench_serve.py; qwen3lab's own prompts as its custom
dataset, or its random dataset with --no-same-prompts; the same lengths, `--ignore-eos`, the same warm-ups), so that drift of the machine hits both; both clients run on the cores the
server's pin leaves (`--client-cpus`), so neither takes CPU from the server it measures; the server's own mean TTFT and TPOT
over each round referee when the clients disagree. The launch path (`--launch-rounds`): rounds that alternate
`qwen3lab run` of the experiment with `kind: vllm` (qwen3lab starts the server) and the same run against a
server started by hand (`kind: endpoint`), a fresh server each: one client, only the launcher differs.
Prints per-round tables and the medians' ratios (target: every figure within 5%; client CPU per 1,000 tokens
at most half of vLLM's), and writes JSON under bench/results/ with the machine's load average.

    PYTHONPATH=$PWD .venv/bin/python bench/fidelity_bench.py [--rounds 5] [--launch-rounds 1]
        [--requests 200] [--concurrency 16] [--tokens 128] [--output-tokens N] [--warmup 8]
        [--model builtin:qwen3-tiny | FOLDER] [--max-model-len 2048] [--gpu h200]
        [--no-same-prompts] [--scrape-interval S] [--gpu-sample-interval S] [--nvml-ab] [--no-prefix-caching]

On a GPU host (tools/h200_device.sh benches): `--model` a local model folder (dummy weights), `--gpu` the
catalogue id written into the experiment.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qwen3lab.models import resolve_model_path  # noqa: E402

MODEL = "builtin:qwen3-tiny"  # --model
MAX_MODEL_LEN = 2048  # --max-model-len
FIELDS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "cpu_s_per_1k_tokens")
SHORT = dict(zip(FIELDS, ("out tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "CPU s/1k tok")))
TOOLS = ("vllm bench serve", "qwen3lab run")


def _env(repo: Path = REPO) -> dict:
    # the checkout first, then whatever the environment had (a GPU kit's packages are found through it)
    path = os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "VLLM_CPU_KVCACHE_SPACE": "1"}


PREFIX_CACHING = True  # vLLM's default; --no-prefix-caching turns it off on the measured server
CLIENT_CPUS: set[int] | None = None  # where both clients of the endpoint rounds run (--client-cpus)


def _pin_client() -> None:
    if CLIENT_CPUS:
        os.sched_setaffinity(0, CLIENT_CPUS)


def default_client_cpus() -> set[int] | None:
    """The cores the server's pin leaves (engine.cpu_server_pin): core 0 on this 2-core machine. Unpinned, a
    heavier client also runs on the server's core and slows the very server it measures (vllm bench serve's
    client, 0.05 s of CPU per 1,000 tokens against qwen3lab's 0.03, saw 7% less throughput on the same server)."""
    from qwen3lab.experiment.spec import EngineConfig
    from qwen3lab.measure import engine

    pin = engine.cpu_server_pin(EngineConfig(model=MODEL), engine.probe_build(sys.executable))
    if not pin:
        return None
    server = {int(c) for c in pin[-1].split(",")}
    return (os.sched_getaffinity(0) - server) or None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HandServer:
    """`vllm serve` as a user starts it by hand: the module, vLLM's defaults, output to a log file, on the cores
    qwen3lab's own launch and stored command use."""

    def __init__(self, log: Path, timeout_s: float = 900, serve_args: tuple[str, ...] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = str(resolve_model_path(MODEL))
        from qwen3lab.experiment.spec import EngineConfig
        from qwen3lab.measure import engine

        # the server on the cores qwen3lab launches it on (engine.cpu_server_pin, in the command it stores):
        # the launch path then differs by the launcher alone
        pin = engine.cpu_server_pin(EngineConfig(model=MODEL), engine.probe_build(sys.executable))
        argv = [*pin, sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--load-format", "dummy", "--max-model-len", str(MAX_MODEL_LEN), "--port", str(self.port),
                *([] if PREFIX_CACHING else ["--no-enable-prefix-caching"]), *serve_args]
        self.log = open(log, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=_env(),
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited ({self.proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise SystemExit(f"the server was not ready after {timeout_s} s; see {log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


SERVER_SIDE = {"server_mean_ttft_ms": "vllm:time_to_first_token_seconds",
               "server_mean_tpot_ms": "vllm:request_time_per_output_token_seconds"}


def server_sums(url: str) -> dict[str, float]:
    """The server's own TTFT and TPOT histograms (sum and count): the referee when the two clients disagree."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for hist in SERVER_SIDE.values():
            for part in ("_sum", "_count"):
                if line.startswith(hist + part):
                    out[hist + part] = out.get(hist + part, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def with_server_view(url: str, measure) -> dict:
    """`measure()`'s figures, with the server's mean TTFT and TPOT over the same round (warm-ups included)."""
    before = server_sums(url)
    got = measure()
    after = server_sums(url)
    for key, hist in SERVER_SIDE.items():
        n = after[hist + "_count"] - before[hist + "_count"]
        got[key] = 1000 * (after[hist + "_sum"] - before[hist + "_sum"]) / n if n else float("nan")
    return got


def vllm_bench(url: str, args, work: Path, tag: str) -> dict:
    """One `vllm bench serve` round; its result JSON's figures."""
    model = str(resolve_model_path(MODEL))
    argv = [sys.executable, str(REPO / "bench" / "vllm_bench_serve.py"), "--backend", "vllm", "--base-url", url,
            "--model", model, "--tokenizer", model,
            *(["--dataset-name", "custom", "--dataset-path", str(args.same_prompts_file), "--skip-chat-template",
               "--custom-output-len", str(args.output_tokens)] if args.same_prompts else
              ["--dataset-name", "random", "--random-input-len", str(args.tokens), "--random-output-len",
               str(args.output_tokens), "--random-range-ratio", "0"]),
            "--num-prompts", str(args.requests), "--max-concurrency",
            str(args.concurrency), "--num-warmups", str(args.warmup), "--ignore-eos", "--seed", "0",
            # greedy, as qwen3lab's workload sends by default (temperature 0.0): without it vllm bench serve sends
            # no temperature, the server samples at 1.0, and its TPOT was 11% longer for that work alone
            "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
            "--save-result", "--result-dir", str(work), "--result-filename", f"{tag}.json"]
    subprocess.run(argv, check=True, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   preexec_fn=_pin_client)
    out = json.loads((work / f"{tag}.json").read_text())
    return {"output_throughput": out["output_throughput"], "median_ttft_ms": out["median_ttft_ms"],
            "p99_ttft_ms": out["p99_ttft_ms"], "median_tpot_ms": out["median_tpot_ms"],
            "mean_ttft_ms": out["mean_ttft_ms"], "mean_tpot_ms": out["mean_tpot_ms"],
            "cpu_s_per_1k_tokens": 1000 * out["client_cpu_s"] / out["client_cpu_tokens"],
            "completed": out["completed"]}


def experiment_yaml(args, engine: dict) -> str:
    import yaml

    return yaml.safe_dump({
        "name": "fidelity", "gpu": args.gpu, "engine": engine, "workload": workload_fields(args),
        "chapters": {"main": {"question": "fidelity", "trials": [{"name": "t"}]}},
    })


def workload_fields(args) -> dict:
    return {"num_requests": args.requests, "warmup_requests": args.warmup, "concurrency": args.concurrency,
            "seed": 0, "mix": [{"name": "fixed", "prompt_tokens": args.tokens, "output_tokens": args.output_tokens}],
            "scrape_interval_s": args.scrape_interval,
            "gpu_sample_interval_s": args.gpu_sample_interval or None}


def qwen3lab_prompts(args) -> list[str]:
    """The measured prompts `qwen3lab run` sends (its workload, seed 0)."""
    from qwen3lab.experiment.spec import Workload
    from qwen3lab.measure import workload as wl

    model = str(resolve_model_path(MODEL))
    requests = wl.build_requests(Workload(**workload_fields(args)), wl.load_tokenizer(model), MAX_MODEL_LEN, 0)
    return [r.prompt for r in requests[args.warmup:]]


def tokenize_cost(args, ours: list[str]) -> dict:
    """What the server's tokenizer pays per prompt for each client's prompts (the model's own tokenizer, through
    transformers as vLLM's front end loads it; the best of 3 passes, on this machine's CPU)."""
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import RandomDataset

    model = str(resolve_model_path(MODEL))
    tok = AutoTokenizer.from_pretrained(model)
    theirs = [r.prompt for r in RandomDataset(random_seed=0).sample(
        tokenizer=tok, num_requests=args.requests, prefix_len=0, range_ratio=0.0, input_len=args.tokens,
        output_len=args.output_tokens)]
    out = {}
    for name, prompts in (("vllm bench serve (random dataset)", theirs), ("qwen3lab run", ours)):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            lengths = [len(tok(p).input_ids) for p in prompts]
            best = min(best, time.perf_counter() - t)
        out[name] = {"ms_per_prompt": 1000 * best / len(prompts), "tokens": sorted(set(lengths)),
                     "chars_per_prompt": sum(map(len, prompts)) / len(prompts)}
    return out


def write_qwen3lab_prompts(prompts: list[str], output_tokens: int, path: Path) -> Path:
    """The prompts `qwen3lab run` sends, as a `vllm bench serve --dataset-name custom` file.

    The clients' own prompts differ in what the server's tokenizer pays (`tokenize_cost`: with the H200 kit's
    tokenizer 1.8 ms against qwen3lab's 4.7 ms per 1,024-token prompt on a 2-core VM), and the server's front end
    tokenizes a closed loop's simultaneous arrivals one after another."""
    path.write_text("".join(json.dumps({"prompt": p, "output_tokens": output_tokens}) + "\n" for p in prompts))
    return path


def qwen3lab_run(engine: dict, args, work: Path, tag: str, repo: Path = REPO) -> dict:
    """One `qwen3lab run` round (the real CLI, a subprocess, a fresh DuckDB); the figures it stored.
    `repo`: the checkout whose qwen3lab runs (another commit's, to measure one change at a time)."""
    from qwen3lab.store import Store

    exp, db = work / f"{tag}.yaml", work / f"{tag}.duckdb"
    exp.write_text(experiment_yaml(args, engine))
    subprocess.run([sys.executable, "-m", "qwen3lab", "run", str(exp), "--db", str(db), "--runs-dir",
                    str(work / "runs"), "--fresh"], check=True, env=_env(repo), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd=work,
                   # a launched server would inherit the client's cores: only an endpoint run's client is pinned
                   preexec_fn=_pin_client if engine.get("kind") == "endpoint" else None)
    runs = Store(db).runs(with_json=True)
    row = runs.iloc[0]
    if row.status != "ok":
        raise SystemExit(f"qwen3lab run ended {row.status}: {row.reason}")
    s = json.loads(row.summary_json)
    return {k: s[k] for k in FIELDS[:-1] + ("mean_ttft_ms", "mean_tpot_ms", "completed")} | {
        "cpu_s_per_1k_tokens": s["client_cpu_s_per_1k_tokens"],
        # of it, the /metrics scraper's process (telemetry vLLM's tool does not do)
        "scraper_cpu_s_per_1k_tokens": 1000 * s.get("scraper_cpu_s", float("nan")) / max(s["total_output_tokens"], 1),
        # and the NVML sampling thread's (over its whole life, a little longer than the load)
        "gpu_sampler_cpu_s_per_1k_tokens": 1000 * s.get("gpu_sampler_cpu_s", float("nan")) / max(s["total_output_tokens"], 1),
        "loop_lag_p99_ms": s.get("client_loop_lag_p99_ms"),
        "loop_lag_max_ms": s.get("client_loop_lag_max_ms")}


def endpoint_engine(server: HandServer) -> dict:
    return {"kind": "endpoint", "url": server.url, "model": server.model, "tokenizer": server.model}


def launched_engine() -> dict:
    return {"kind": "vllm", "model": MODEL, "load_format": "dummy", "max_model_len": MAX_MODEL_LEN,
            **({} if PREFIX_CACHING else {"enable_prefix_caching": False}),  # as the server by hand
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}


NO_NVML = "qwen3lab run, NVML off"  # --nvml-ab


def endpoint_rounds(args, work: Path, console, save=lambda rows: None) -> dict:
    """Alternating rounds on one server; `save(rows)` after each, so that a run cut short keeps what it measured."""
    tools = TOOLS + ((NO_NVML,) if args.nvml_ab else ())
    rows = {t: [] for t in tools}
    no_nvml = argparse.Namespace(**{**vars(args), "gpu_sample_interval": 0})
    with HandServer(work / "server.log") as server:
        # unrecorded: a GPU server's first loads of a shape are its own warm-up (on the H200 the first round's
        # TTFT was 750 ms for both clients, the next ones' ~100 ms), so --prime-requests of them come first
        vllm_bench(server.url, argparse.Namespace(**{**vars(args), "requests": args.prime_requests, "warmup": 0}),
                   work, "prime")
        for r in range(args.rounds):
            # qwen3lab's settings (--nvml-ab) swap places every round, so that the server's drift hits both
            for tool in tools if r % 2 == 0 else tools[:1] + tools[:0:-1]:
                started = time.monotonic()
                got = with_server_view(server.url, lambda: (
                    vllm_bench(server.url, args, work, f"vllm-{r}") if tool == TOOLS[0] else
                    qwen3lab_run(endpoint_engine(server), args, work, f"q-{r}") if tool == TOOLS[1] else
                    qwen3lab_run(endpoint_engine(server), no_nvml, work, f"q-off-{r}")))
                rows[tool].append(got | {"loadavg_1m": os.getloadavg()[0], "round_s": time.monotonic() - started})
                save(rows)
                console.print(f"endpoint round {r + 1} {tool}: " + ", ".join(f"{k}={got[k]:.3f}" for k in FIELDS)
                              + (f", client loop lag p99/max {got['loop_lag_p99_ms']:.1f}/{got['loop_lag_max_ms']:.1f} ms"
                                 if got.get("loop_lag_p99_ms") is not None else "")
                              + f" ({rows[tool][-1]['round_s']:.0f} s)")
    return rows


BY_HAND, LAUNCHING = "qwen3lab run, server by hand", "qwen3lab run (kind: vllm)"


def launch_rounds(args, work: Path, console) -> dict:
    """The same client both sides, so that only who started the server differs; a fresh server each."""
    rows = {BY_HAND: [], LAUNCHING: []}
    for r in range(args.launch_rounds):
        with HandServer(work / f"hand-{r}.log") as server:
            got = qwen3lab_run(endpoint_engine(server), args, work, f"hand-{r}") | {"loadavg_1m": os.getloadavg()[0]}
        rows[BY_HAND].append(got)
        console.print(f"launch round {r + 1} by hand: " + ", ".join(f"{k}={got[k]:.3f}" for k in FIELDS))
        got = qwen3lab_run(launched_engine(), args, work, f"launch-{r}") | {"loadavg_1m": os.getloadavg()[0]}
        rows[LAUNCHING].append(got)
        console.print(f"launch round {r + 1} qwen3lab: " + ", ".join(f"{k}={got[k]:.3f}" for k in FIELDS))
    return rows


def compare(rows: dict, title: str, console, cpu_half: bool = True) -> dict:
    """Per-round table, medians and their ratios (ours / theirs) with the target's verdict: every figure within
    5%, and client CPU at most half (`cpu_half`, against vLLM's client) or within 5% (the same client)."""
    from rich.table import Table

    theirs, ours = list(rows)
    table = Table(title=title)
    table.add_column("round")
    for name in rows:
        for k in FIELDS:
            table.add_column(f"{name}: {SHORT[k]}", justify="right")
    table.add_column("load (1 min)", justify="right")
    for r, pair in enumerate(zip(rows[theirs], rows[ours])):
        table.add_row(str(r + 1), *(f"{x[k]:.2f}" for x in pair for k in FIELDS), f"{pair[1]['loadavg_1m']:.1f}")
    med = {name: {k: statistics.median(x[k] for x in runs) for k in FIELDS} for name, runs in rows.items()}
    table.add_row("median", *(f"{med[n][k]:.2f}" for n in rows for k in FIELDS), "", style="bold")
    console.print(table)
    ratios, meets = {}, {}
    for k in FIELDS:
        ratios[k] = med[ours][k] / med[theirs][k] if med[theirs][k] else float("nan")
        meets[k] = bool(ratios[k] <= 0.5 if k == "cpu_s_per_1k_tokens" and cpu_half else abs(ratios[k] - 1) <= 0.05)
    if all("server_mean_ttft_ms" in x for runs in rows.values() for x in runs):
        for name, runs in rows.items():  # each client's means against the server's own over its rounds
            console.print(f"{name}: " + ", ".join(
                f"{m} client/server {statistics.median(x[f'mean_{m}_ms'] / x[f'server_mean_{m}_ms'] for x in runs):.3f}"
                for m in ("ttft", "tpot")) + " (medians over rounds of the means' ratio)")
    for name, runs in rows.items():
        if all("scraper_cpu_s_per_1k_tokens" in x for x in runs):
            scraper = statistics.median(x["scraper_cpu_s_per_1k_tokens"] for x in runs)
            nvml = statistics.median(x.get("gpu_sampler_cpu_s_per_1k_tokens", float("nan")) for x in runs)
            console.print(f"{name}: client CPU {med[name]['cpu_s_per_1k_tokens']:.4f} s per 1k tokens, of which the "
                          f"/metrics scraper {scraper:.4f} and the GPU sampler {nvml:.4f} (medians)")
    console.print(f"{ours} / {theirs} (medians): " + ", ".join(
        f"{k} {ratios[k]:.3f} {'ok' if meets[k] else 'MISSED'}" for k in FIELDS))
    return {"rounds": rows, "median": med, "ratio": ratios, "meets_target": meets}


def machine_load() -> dict:
    from qwen3lab.hardware.catalogue import cpu_topology

    # the CPU and its vector extensions: 2-core VMs ran vLLM ~8x apart
    return {"loadavg": os.getloadavg(), "cpus": os.cpu_count(), "cpu": cpu_topology()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The bench's arguments (tests/test_fidelity.py builds its load from them too: one set of defaults)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="alternating endpoint rounds (0: none)")
    ap.add_argument("--scrape-interval", type=float, default=1.0,
                    help="qwen3lab's /metrics scrape interval (workload.scrape_interval_s; its default 1 s): does "
                         "the scraping perturb the server?")
    ap.add_argument("--gpu-sample-interval", type=float, default=0.5,
                    help="qwen3lab's NVML sampling interval (workload.gpu_sample_interval_s; its default 0.5 s; 0: "
                         "off): do the NVML calls perturb the server?")
    ap.add_argument("--same-prompts", action=argparse.BooleanOptionalAction, default=True, help=(
        "vllm bench serve sends qwen3lab's prompts (its custom dataset), so that the server's tokenizer does the "
        "same work for both clients and only the clients differ; --no-same-prompts: its random dataset's, whose "
        "text costs the server's tokenizer less than half as much per token (the bench prints both)"))
    ap.add_argument("--nvml-ab", action="store_true", help=(
        "each endpoint round also runs qwen3lab with NVML sampling off (gpu_sample_interval_s null), in "
        "alternating order: whether NVML's calls cost the server, measured on one launch"))
    ap.add_argument("--launch-rounds", type=int, default=1, help="alternating launch-path rounds, a fresh server each")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128, help="prompt (and, unless --output-tokens, output) tokens")
    ap.add_argument("--output-tokens", type=int, default=None, help="output tokens per request (default: --tokens)")
    ap.add_argument("--model", default=MODEL, help="builtin:qwen3-tiny or a local model folder (dummy weights)")
    ap.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    ap.add_argument("--gpu", default="cpu", help="the experiment's gpu (catalogue id, e.g. h200)")
    ap.add_argument("--warmup", type=int, default=8, help="warm-up requests before each measured load")
    ap.add_argument("--prime-requests", type=int, default=16,
                    help="requests of an unrecorded vllm bench round on the endpoint server before the measured ones")
    ap.add_argument("--client-cpus", default="auto", help="CPUs both clients of the endpoint rounds run on: "
                    "auto (the cores the server's pin leaves, core 0 here), none (unpinned), or a list like 0")
    ap.add_argument("--no-prefix-caching", action="store_true", help=(
        "start the server with --no-enable-prefix-caching. Both clients send the same prompts every round (seed 0), "
        "so with the cache on a round is fast or slow by what earlier rounds left cached: on the H200 (KV cache "
        "~600k tokens, 345k a round) vllm bench's round after a same-seed prime ran at TTFT 106 ms, the others "
        "at ~760 ms. Off, every round is the same work and only the client differs"))
    ap.add_argument("--out", default=str(REPO / "bench/results/fidelity_bench.json"))
    args = ap.parse_args(argv)
    args.output_tokens = args.output_tokens or args.tokens
    return args


def main() -> None:
    global CLIENT_CPUS, MODEL, MAX_MODEL_LEN, PREFIX_CACHING
    from rich.console import Console

    args = parse_args()
    MODEL, MAX_MODEL_LEN, PREFIX_CACHING = args.model, args.max_model_len, not args.no_prefix_caching
    CLIENT_CPUS = (default_client_cpus() if args.client_cpus == "auto" else None if args.client_cpus == "none"
                   else {int(c) for c in args.client_cpus.split(",")})
    console = Console(width=250)
    console.print(f"endpoint rounds' clients on CPUs {sorted(CLIENT_CPUS) if CLIENT_CPUS else 'any'}")
    load_before, out = machine_load(), Path(args.out)
    result = {"args": vars(args), "client_cpus": sorted(CLIENT_CPUS or []), "load_before": load_before}
    ours = qwen3lab_prompts(args)  # built once: timed for the tokenizer, and sent by vllm bench with --same-prompts
    result["tokenize"] = tokenize_cost(args, ours)
    for name, got in result["tokenize"].items():
        console.print(f"server-side tokenization of {name}'s prompts: {got['ms_per_prompt']:.2f} ms per prompt "
                      f"({got['chars_per_prompt']:.0f} characters, {got['tokens']} tokens)")
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        if args.same_prompts:
            args.same_prompts_file = str(write_qwen3lab_prompts(ours, args.output_tokens, Path(tmp) / "prompts.jsonl"))
        what = f"{args.requests} requests x {args.tokens} in / {args.output_tokens} out, concurrency {args.concurrency}"
        if args.rounds:
            rows = endpoint_rounds(args, Path(tmp), console, save=lambda rows: write(out, result | {
                "endpoint_rounds_so_far": rows}))
            result["endpoint"] = compare({t: rows[t] for t in TOOLS}, f"endpoint: one server by hand, {what}", console)
            if args.nvml_ab:  # the same client, NVML's sampling the only difference (ratios: off / on)
                result["nvml_ab"] = compare({t: rows[t] for t in (TOOLS[1], NO_NVML)},
                                            f"NVML sampling every {args.gpu_sample_interval:g} s and off, one launch, "
                                            f"{what}", console, cpu_half=False)
        if args.launch_rounds:
            result["launch"] = compare(launch_rounds(args, Path(tmp), console),
                                       f"launch path: a fresh server per run, {what}", console, cpu_half=False)
    result["load_after"] = machine_load()
    console.print(f"target: every figure within 5% of vLLM's tool, client CPU at most half; machine load "
                  f"(1/5/15 min) before {load_before['loadavg']}, after {result['load_after']['loadavg']}")
    write(out, result)
    console.print(f"wrote {out}")


def write(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
