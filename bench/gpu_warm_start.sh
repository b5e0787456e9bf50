#!/bin/bash
# warm_start.py on the device tool H200 (CUDA, JAX 0.11.2): wheels in .gpu/wheels as bench/gpu_check.sh says;
# run from the repo root there with .gpu carried. Results: bench/results/warm_start-gpu-h200-*.
set -u
REPO=$(pwd)
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=$(command -v python3)
$PY -m pip install -q --no-deps --no-index "$REPO"/.gpu/wheels/*.whl || { echo "install failed"; exit 1; }
cd /tmp
timeout 420 $PY "$REPO/bench/warm_start.py" --platform cuda --runs 5 \
  --configs "no cache,jax local cache,artifactstore embedded (warm)" \
  --out "$OUT/warm_start-gpu.json"
echo "rc=$?"
