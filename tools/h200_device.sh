#!/usr/bin/env bash
# How experiments/results/h200-qwen3-14b.duckdb was made (issue 12): run on the lent H200 from the session's
# checkout, with the gpu-kit parts, this script (as .gpukit/gpu/device.sh), tools/experiment_slice.py (as
# .gpukit/gpu/slice.py) and `git archive` of the commit measured (.gpukit/gpu/q3src.tar.gz) carried beside it.
#   STAGE copy                               the carried kit parts into /root/kit
#   STAGE run TIMEOUT_S CHAPTER/TRIAL...     `qwen3lab run` on a copy of the H200 experiment cut to those trials
#                                            (a bare CHAPTER: all its trials)
#   STAGE sweep TIMEOUT_S CHAPTER/TRIAL...   `qwen3lab sweep` (papermill, executed notebooks) on the same cut; the
#                                            image lacks papermill, ipykernel and plotly: carry their wheels as
#                                            .gpukit/gpu/nbwheels/ (installed once); the executed notebooks come
#                                            back under $OUT/notebooks/. The attention chapters (issue 31):
#                                            `run 520 attention_and_builds` until its 8 launches are in (resumes),
#                                            the same for attention_long_prompts, then `sweep 300 attention_and_builds
#                                            attention_long_prompts` executes notebook 60 on the stored runs
#   STAGE tests TIMEOUT_S PYTEST_K           `make test-gpu`'s tests (PYTEST_K: pytest -k, "" for all)
#   STAGE capacity TIMEOUT_S [CHAPTER/TRIAL...]  `qwen3lab capacity experiments/h200-qwen3-14b-capacity.yaml`, cut to
#                                            those trials (resumes), into a DuckDB of its own
#   STAGE check TIMEOUT_S                    bench/capacity_vs_vllm_bench.py on online FP8: qwen3lab's capacity C and
#                                            first failing load F on a server started by hand, then `vllm bench
#                                            serve` at C and at F (the capacity experiment's lengths and SLO)
#   STAGE start 0 "STEP; STEP; ..."          those steps one after another in the background (a step is a stage
#                                            with its arguments), each writing under /root/out; a call may end
#   STAGE collect TIMEOUT_S                  wait until the background steps end or TIMEOUT_S passes, then bring
#                                            back what they wrote so far (with the DuckDB) under $OUT
#   STAGE router TIMEOUT_S                   bench/router_bench.py (4 rounds of 2,000 requests at 200/s)
#   STAGE fidelity TIMEOUT_S [ARGS...]       bench/fidelity_bench.py against the 14B (dummy BF16, 1024 in / 128 out,
#                                            300 requests at 32, a full-size unrecorded round first, 4 rounds,
#                                            the prefix cache off: each round the same work); ARGS go on to
#                                            it, e.g. `--rounds 3 --nvml-ab`, `--no-same-prompts`, `--scrape-interval 30`, `--gpu-sample-interval 0`
#   STAGE benches TIMEOUT_S                  both, the router's first: an idle 16-core host
# Every stage after the first starts from the committed DuckDB (the first time) and returns it under $OUT.
set -u
K=/root/kit; STAGE=$1; shift; DB=/root/h200-qwen3-14b.duckdb; BG=/root/out
mkdir -p $K "$OUT"
cp .gpukit/gpukit.tar.xz.part* .gpukit/SHA256SUMS .gpukit/install.sh $K/ 2>/dev/null
if [ "$STAGE" = copy ]; then
  ls -la $K
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  exit 0
fi
if [ "$STAGE" = collect ]; then  # the background steps' files, however far they got
  T=$1; end=$((SECONDS + T))
  while [ ! -f $BG/done ] && [ $SECONDS -lt $end ]; do sleep 5; done
  cp -r $BG/. "$OUT/" 2>/dev/null; cp /root/*.duckdb "$OUT/" 2>/dev/null
  tail -c 4000 $BG/bg.log 2>/dev/null; ls -la "$OUT"
  exit 0
fi
if [ ! -d /root/site/vllm ]; then
  bash $K/install.sh $K /root 2>&1 | tail -5
  [ -d /root/site/vllm ] || exit 3
fi
if [ "${Q3_BACKGROUND:-}" != 1 ]; then  # a background step runs from the copies below, not the synced checkout
  rm -rf $K/qwen3lab && mkdir -p $K/qwen3lab && tar -xzf .gpukit/gpu/q3src.tar.gz -C $K/qwen3lab || exit 4
  # provenance: `git archive` keeps the commit in the tar's pax header; runs store it as archive:SHA
  python3 -c 'import sys, tarfile; print(tarfile.open(sys.argv[1]).pax_headers.get("comment", ""))' \
      .gpukit/gpu/q3src.tar.gz > $K/qwen3lab/COMMIT
  rm -rf $K/gpu && cp -r .gpukit/gpu $K/gpu
  [ -f $DB ] || cp experiments/results/h200-qwen3-14b.duckdb $DB
fi
if [ "$STAGE" = start ]; then
  mkdir -p $BG && rm -f $BG/done
  Q3_BACKGROUND=1 setsid nohup bash -c "IFS=';'; for step in \$1; do eval OUT=$BG bash $K/gpu/device.sh \$step; done; \
      touch $BG/done" _ "$2" > $BG/bg.log 2>&1 < /dev/null &
  echo "started: $2"
  exit 0
fi
source $K/env.sh
if [ -d .gpukit/gpu/nbwheels ] && [ ! -d /root/nbsite/papermill ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/nbsite .gpukit/gpu/nbwheels/*.whl \
      2>&1 | tail -3
fi
[ -d /root/nbsite ] && export PYTHONPATH="$PYTHONPATH:/root/nbsite"   # after the kit's: its pins come first
cd $K/qwen3lab
T=$1; shift
touch "$DB.stamp"
case "$STAGE" in
  run|sweep)
    python3 $K/gpu/slice.py experiments/h200-qwen3-14b.yaml experiments/h200-qwen3-14b-slice.yaml "$@" 2>&1
    timeout --signal=INT --kill-after=30 $T python3 -m qwen3lab $STAGE experiments/h200-qwen3-14b-slice.yaml \
        --db $DB --runs-dir /root/runs > "$OUT/$STAGE.log" 2>&1
    echo "$STAGE rc=$?"
    tail -c 6000 "$OUT/$STAGE.log"
    mkdir -p "$OUT/notebooks"   # the executed notebooks of this call (a cut call's are written too, marked)
    find /root/runs -name '*.ipynb' -newer "$DB.stamp" -exec cp {} "$OUT/notebooks/" \; 2>/dev/null ;;
  capacity)  # a store of its own, as experiments/results/h200-qwen3-14b-capacity.duckdb
    DB=/root/h200-capacity-steady.duckdb; XP=experiments/h200-qwen3-14b-capacity.yaml
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then  # an H100 lent instead: say so
      sed 's/^gpu: h200/gpu: h100/; s/^name: h200-/name: h100-/' $XP > experiments/h100-capacity.yaml
      DB=/root/h100-capacity-steady.duckdb; XP=experiments/h100-capacity.yaml
    fi
    [ $# -gt 0 ] && python3 $K/gpu/slice.py $XP experiments/h200-capacity-slice.yaml "$@" && XP=experiments/h200-capacity-slice.yaml
    tag=$(date +%H%M%S)
    timeout --signal=INT --kill-after=30 $T python3 -m qwen3lab capacity $XP \
        --db $DB --runs-dir /root/runs --json > "$OUT/capacity-$tag.json" 2> "$OUT/capacity-$tag.log"
    echo "capacity rc=$?"
    tail -c 6000 "$OUT/capacity-$tag.log" ;;
  check)
    timeout --signal=INT --kill-after=30 $T python3 bench/capacity_vs_vllm_bench.py --model $K/qwen3-14b-dummy \
        --max-model-len 4096 --gpu h200 --serve-arg=--quantization --serve-arg=fp8 --tokens 272 --output-tokens 160 \
        --range-ratio 0.6 --start 16 --max-points 8 --ttft-ms 500 --tpot-ms 40 --out "$OUT" > "$OUT/check.log" 2>&1
    echo "check rc=$?"
    tail -c 4000 "$OUT/check.log" ;;
  router|fidelity|benches)
    if [ "$STAGE" != fidelity ]; then
      timeout --signal=INT 200 python3 bench/router_bench.py --rounds 4 --out "$OUT/router_bench.json" \
          > "$OUT/router_bench.log" 2>&1
      echo "router_bench rc=$?"; tail -c 3000 "$OUT/router_bench.log"
    fi
    if [ "$STAGE" != router ]; then
      timeout --signal=INT $T python3 bench/fidelity_bench.py --model $K/qwen3-14b-dummy --gpu h200 --max-model-len 4096 \
          --tokens 1024 --output-tokens 128 --requests 300 --concurrency 32 --warmup 8 --prime-requests 300 --rounds 4 \
          --no-prefix-caching "$@" \
          --launch-rounds 0 --out "$OUT/fidelity_bench.json" > "$OUT/fidelity_bench.log" 2>&1
      echo "fidelity_bench rc=$?"; tail -c 6000 "$OUT/fidelity_bench.log"
    fi
    exit 0 ;;
  tests)
    timeout --signal=INT --kill-after=30 $T python3 -m pytest -m gpu -v -p no:cacheprovider \
        tests/test_gpu_paths.py tests/test_hardware.py ${1:+-k "$1"} > "$OUT/test-gpu-$(date +%H%M%S).log" 2>&1
    echo "tests rc=$?"
    tail -c 5000 "$OUT"/test-gpu-*.log ;;
esac
python3 -m qwen3lab runs --db $DB 2>&1 | tail -40
cp $DB "$OUT/" 2>/dev/null
tar -czf "$OUT/runs.tar.gz" -C /root runs 2>/dev/null
ls -la "$OUT"
