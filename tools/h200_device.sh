#!/usr/bin/env bash
# How experiments/results/h200-qwen3-14b.duckdb was made (issue 12): run on the lent H200 from the session's
# checkout, with the gpu-kit parts, this script (as .gpukit/gpu/device.sh), tools/experiment_slice.py (as
# .gpukit/gpu/slice.py) and `git archive` of this branch (.gpukit/gpu/q3src.tar.gz) carried beside it.
# STAGE copy | run TIMEOUT_S CHAPTER/TRIAL... | tests TIMEOUT_S PYTEST_K
set -u
K=/root/kit; STAGE=$1; shift; R=$(pwd)
mkdir -p $K "$OUT"
cp .gpukit/gpukit.tar.xz.part* .gpukit/SHA256SUMS .gpukit/install.sh $K/ 2>/dev/null
if [ "$STAGE" = copy ]; then
  ls -la $K
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch; f,t=torch.cuda.mem_get_info(); print('cuda total GiB', t/2**30, 'free GiB', f/2**30)"
  exit 0
fi
if [ ! -d /root/site/vllm ]; then
  bash $K/install.sh $K /root 2>&1 | tail -5
  [ -d /root/site/vllm ] || exit 3
fi
rm -rf $K/qwen3lab && mkdir -p $K/qwen3lab && tar -xzf .gpukit/gpu/q3src.tar.gz -C $K/qwen3lab || exit 4
source $K/env.sh
cd $K/qwen3lab
T=$1; shift
if [ "$STAGE" = run ]; then
  python3 $R/.gpukit/gpu/slice.py experiments/h200-qwen3-14b.yaml experiments/h200-qwen3-14b-slice.yaml "$@" 2>&1
  timeout --signal=INT --kill-after=20 $T python3 -m qwen3lab run experiments/h200-qwen3-14b-slice.yaml \
      --db /root/h200-qwen3-14b.duckdb --runs-dir /root/runs > "$OUT/run.log" 2>&1
  echo "run rc=$?"
  tail -c 6000 "$OUT/run.log"
else
  timeout --signal=INT --kill-after=20 $T python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu_paths.py -k "$1" \
      > "$OUT/test-gpu.log" 2>&1
  echo "tests rc=$?"
  tail -c 5000 "$OUT/test-gpu.log"
fi
python3 -m qwen3lab runs --db /root/h200-qwen3-14b.duckdb 2>&1 | tail -30
cp /root/h200-qwen3-14b.duckdb* "$OUT/" 2>/dev/null
tar -czf "$OUT/runs.tar.gz" -C /root runs 2>/dev/null
ls -la "$OUT"
