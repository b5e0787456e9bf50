#!/bin/bash
# GPU round trips through the store, on a machine whose image has JAX with CUDA but no
# network (the device tool's H200: python3 = /opt/torch/.venv, jax 0.11.2 + cuda13 plugin).
# Prepare the wheels it installs (--no-deps, --no-index) here, then run it from the repo
# root there with .gpu carried:
#   mkdir -p .gpu/wheels && pip download -d .gpu/wheels --no-deps --only-binary=:all: \
#     --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
#     --platform any boto3 botocore s3transfer jmespath sqlalchemy greenlet alembic mako \
#     zstandard platformdirs cryptography cffi pycparser
#   pip wheel --no-deps -w .gpu/wheels . && cp bench/gpu_check.sh .gpu/check.sh
# What it checks: doctor (hook on this JAX, GPU fingerprint), the demo (stored, then
# loaded in a fresh process), activation by ARTSTORE_URL alone, `artstore run` with a
# subprocess and a spawn worker, host callbacks (GPU FFI targets) and named executables,
# each cold then warm. Results: bench/results/gpu_check-*.txt.
# GPU checks for artifactstore, run by the device tool from the repo root.
set -u
REPO=$(pwd)
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 ARTSTORE_MIN_COMPILE_SECS=0 XDG_CACHE_HOME=/tmp/xdg
PY=$(command -v python3)
echo "python: $PY $($PY --version)"; nvidia-smi -L
$PY -m pip install -q --no-deps --no-index "$REPO"/.gpu/wheels/*.whl || { echo "install failed"; exit 1; }
SP=$($PY -c 'import site; print(site.getsitepackages()[0])'); ls "$SP" | grep -i artifactstore
step() { local name=$1; shift; echo "== $name"; timeout 240 "$@"; echo "== $name rc=$?"; }
cd /tmp
step versions $PY -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__, jax.devices())'
step doctor $PY -m artifactstore --url /tmp/s1 doctor
step demo $PY -m artifactstore --url /tmp/s1 demo
step ls $PY -m artifactstore --url /tmp/s1 ls
cd "$REPO/tests/programs"
step plain-cold env ARTSTORE_URL=/tmp/s2 $PY plain_jax.py
step plain-warm env ARTSTORE_URL=/tmp/s2 $PY plain_jax.py
step run-cold env PLAIN_SPAWN=1 $PY -m artifactstore --url /tmp/s3 run -- $PY plain_jax.py
step run-warm env PLAIN_SPAWN=1 $PY -m artifactstore --url /tmp/s3 run --read-only -- $PY plain_jax.py
for c in pure io debug; do
  step "cb-$c-1" env ARTSTORE_URL=/tmp/s4 ARTSTORE_ACTIVATE=0 CALLBACKS_CASE=$c $PY callbacks.py
  step "cb-$c-2" env ARTSTORE_URL=/tmp/s4 ARTSTORE_ACTIVATE=0 CALLBACKS_CASE=$c $PY callbacks.py
done
step named-build env ARTSTORE_URL=/tmp/s5 NAMED_MODE=compiled $PY named_job.py
step named-load env ARTSTORE_URL=/tmp/s5 NAMED_MODE=load $PY named_job.py
step ls-all $PY -m artifactstore --url /tmp/s4 ls
echo "== done"
