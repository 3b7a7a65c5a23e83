#!/usr/bin/env bash
# Build here (MLIR, no GPU) the bundles of bench/calls/stop60.sh, packed into .gpucarry/:
#   bash bench/calls/stop60_build.sh [NAME ...]
# Sets:
#   tf32   gdn_bwd's dk kernel (the one kernel storing per-chunk dA_log / ddt_bias partial
#          sums) with its plain products in TF32 instead of bf16x3
#          (kda-assign-precision{gate_gradient_products=tf32}; its adjoint decay products keep
#          tf32x3): ab_tf32dk (bench, gdn), check_tf32dk (the GPU check's gdn_* set). In the
#          CPU simulator (B1_T200 correlated steep) dA_log 6.04e-4 -> 6.34e-4, dv 1.505e-3 ->
#          1.529e-3; ptxas: 7392 -> 6552 SASS instructions, no spill
#   f16c   the forwards' checkpoints (the state at chunk start, v') stored in fp16
#          (kda-narrow-checkpoints{dtype=fp16}; 10-bit significands, what the output kernel's
#          TF32 products read anyway): bench_def60 (today's default, both ops), ab_f16c (both
#          ops), check_f16c (the GPU check's native set, every program)
#   ff1    chunk flags published after one fence by the publishing thread instead of one per
#          thread (LowerOptions.flag_fence=one): ab_ff1 (both ops), ab_f16ff (with fp16
#          checkpoints too), check_ff1 (the GPU check's native set, every program)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .bundles .gpucarry
source bench/calls/build_common.sh
TF32DK='chip+kda-assign-precision{gate_gradient_products=tf32}'
F16C='chip+kda-narrow-checkpoints{dtype=fp16,scale=none}'   # what stop 60 measured (unscaled)
built=()
for set in "${@:-tf32}"; do
    case "$set" in
    tf32)
        bench ab_tf32dk --ops gdn --pipeline "$TF32DK"
        check check_tf32dk gdn_ --pipeline "$TF32DK"
        built+=(ab_tf32dk check_tf32dk) ;;
    f16c)
        bench bench_def60
        bench ab_f16c --pipeline "$F16C"
        check check_f16c "" --pipeline "$F16C"
        built+=(bench_def60 ab_f16c check_f16c) ;;
    ff1)
        bench ab_ff1 --set flag_fence=one
        bench ab_f16ff --set flag_fence=one --pipeline "$F16C"
        check check_ff1 "" --lower flag_fence=one
        built+=(ab_ff1 ab_f16ff check_ff1) ;;
    *) echo "unknown set $set" >&2; exit 2 ;;
    esac
done
pack "${built[@]}"
