#!/usr/bin/env bash
# The wheels FLA's GDN backward and FlashQLA need on the GPU machine (TileLang and z3), split in
# two carries under the 64 MiB limit per call (which the tracked tree counts too, ~12 MB at
# stop 56): .site1 (tilelang alone, ~50 MB) and .site2 (its small dependencies, z3-solver and
# flash-qla, ~34 MB). Both folders are git-ignored.
#
#   bash bench/reference_wheels.sh          # here: download into .site1 and .site2
#
# then, on the GPU machine, two calls in a row (the machine must still be warm for the second;
# /tmp/site is what bench/gpu_run.sh puts on PYTHONPATH):
#   run(carry=[".site1"]):  python3 -m pip install -q --no-index --no-deps --target /tmp/site .site1/*.whl
#   run(carry=[".site2", ".whl", ".gpucarry"]):
#       python3 -m pip install -q --no-index --no-deps --target /tmp/site .site2/*.whl &&
#       bash bench/gpu_run.sh 'python3 -m kdagen.cli bench --ops gdn ...'   # FLA and FlashQLA columns
# TileLang compiles FlashQLA's kernels on their first call (about two minutes for the backward).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
GPU_PY=3.12          # the GPU image's Python
mkdir -p .site1 .site2
get() {
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PY" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$@"
}
get .site1 "tilelang==0.1.15"
get .site2 "apache-tvm-ffi>=0.1.11,<0.1.13" torch-c-dlpack-ext cloudpickle ml-dtypes psutil \
    tqdm typing-extensions "z3-solver>=4.13.0,<4.15.5" "flash-qla==0.1.3"
du -sh .site1 .site2
