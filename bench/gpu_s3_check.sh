#!/bin/bash
# GPU executables through S3 (moto server over HTTP) + a SQLite index, on the device H200.
# Not yet run (session 11 was refused a second machine). Wheels: as bench/gpu_check.sh says, plus
#   pip download -d .gpu/moto --no-deps --only-binary=:all: --python-version 3.12 --platform any \
#     moto xmltodict responses flask flask-cors py-partiql-parser blinker itsdangerous
# and run from the repo root there with .gpu carried (copy this file to .gpu/s3.sh).
set -u
REPO=$(pwd)
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false ARTSTORE_MIN_COMPILE_SECS=0
PY=$(command -v python3)
$PY -m pip install -q --no-deps --no-index "$REPO"/.gpu/wheels/*.whl "$REPO"/.gpu/moto/*.whl || { echo "install failed"; exit 1; }
cd /tmp
$PY -m moto.server -H 127.0.0.1 -p 5123 > /tmp/moto.log 2>&1 &
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:5123 AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing-secret AWS_DEFAULT_REGION=us-east-1
for i in $(seq 30); do $PY -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:5123")' 2>/dev/null && break; sleep 1; done
$PY -c 'import boto3; boto3.client("s3").create_bucket(Bucket="gpu"); print("bucket ok")'
export ARTSTORE_URL=s3://gpu/cache ARTSTORE_INDEX=sqlite:////tmp/idx.db XDG_CACHE_HOME=/tmp/xdg
step() { local name=$1; shift; echo "== $name"; timeout 200 "$@"; echo "== $name rc=$?"; }
step upgrade $PY -m artifactstore db upgrade
step heavy-cold env ARTSTORE_ACTIVATE=0 $PY -m artifactstore.examples.compile_heavy --store
step heavy-warm-no-tier env ARTSTORE_ACTIVATE=0 ARTSTORE_LOCAL_TIER=off $PY -m artifactstore.examples.compile_heavy --store
step heavy-warm-tier env ARTSTORE_ACTIVATE=0 $PY -m artifactstore.examples.compile_heavy --store
step heavy-no-store env ARTSTORE_ACTIVATE=0 $PY -m artifactstore.examples.compile_heavy
cd "$REPO/tests/programs"
step plain-cold $PY plain_jax.py
step plain-warm-no-tier env ARTSTORE_LOCAL_TIER=off $PY plain_jax.py
cd /tmp
step verify $PY -m artifactstore verify
step ls $PY -m artifactstore ls
step stats $PY -m artifactstore stats
echo "== done"
