#!/usr/bin/env bash
# The router bench on the lent H200 without the whole gpu-kit (it needs no vLLM): the few packages the router,
# the load generator and the bench import, as CPython 3.12 wheels unpacked into .gpukit/router-site.tgz (16 MB).
# Then one device call, carrying .gpukit/router-site.tgz, runs:
#   mkdir -p /root/rs && tar -xzf .gpukit/router-site.tgz -C /root/rs && PYTHONPATH=/root/rs:$PWD \
#     python3 bench/router_bench.py --rounds 4 --out $OUT/router_bench.json > $OUT/router_bench.log 2>&1
# (bench/results/h200/2026-12-03-stop23-router/ was made so.) Versions: the kit's pins, else this checkout's .venv.
set -eu
cd "$(dirname "$0")/.."
W=$(mktemp -d)
pins=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(' '.join(f'{p}=={m.version(p)}' for p in sys.argv[1:]))" \
    typer click rich markdown-it-py mdurl pygments shellingham prometheus_client uvloop psutil tokenizers)
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any -d "$W/wheels" \
    aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1 \
    propcache==0.5.4 yarl==1.25.1 idna==3.20 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    annotated-doc==0.0.7 typing-extensions==4.16.0 typing-inspection==0.4.5 $pins
mkdir -p "$W/site" .gpukit
for w in "$W"/wheels/*.whl; do python3 -m zipfile -e "$w" "$W/site"; done
tar -czf .gpukit/router-site.tgz -C "$W/site" .
rm -rf "$W"
ls -la .gpukit/router-site.tgz
