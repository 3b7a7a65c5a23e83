#!/usr/bin/env bash
# Build here (MLIR, no GPU) the bundles of bench/calls/stop61.sh, packed into .gpucarry/:
#   bash bench/calls/stop61_build.sh [NAME ...]
# Sets:
#   f16s   fp16 checkpoints with their column scale (kda-narrow-checkpoints{dtype=fp16}, whose
#          default scale is "column"), now lowered on the sm_90a register scan (column sums by
#          quad shuffles, the scaled state staged for its TMA store, the [V] norms stored by
#          the quad leaders) and register tiles (each A element of W times its column's
#          norm): bench_def61 (today's default, both ops), ab_f16s (scaled, both ops), ab_f16n
#          (unscaled, what stop 60 measured), check_f16s (the GPU check's native set, every
#          program, scaled)
#   cf     the same with rsqrt.approx and four add chains in the column sums, and the register
#          scans' checkpoints stored before the step waits for its ring tiles
#          (LowerOptions.scan_checkpoints_first): ab_f16s2 (scaled fp16, checkpoints after the
#          wait), ab_f16cf (scaled fp16, checkpoints first), ab_cf (fp32 checkpoints first),
#          check_f16cf and check_cf (the GPU check's native set, every program), check_f16p
#          (the portable set) and check_f16st (what sm_100a / sm_120a run, compiled for
#          sm_90a), both with scaled fp16 checkpoints
#   k256   check_k256f16: the GPU check's K = 256 set with scaled fp16 checkpoints (the register
#          scan splits the state's rows over two warpgroups, whose column sums meet in shared
#          memory)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .bundles .gpucarry
source bench/calls/build_common.sh
F16S='chip+kda-narrow-checkpoints{dtype=fp16}'
F16N='chip+kda-narrow-checkpoints{dtype=fp16,scale=none}'
built=()
for set in "${@:-f16s}"; do
    case "$set" in
    f16s)
        bench bench_def61
        bench ab_f16s --pipeline "$F16S"
        bench ab_f16n --pipeline "$F16N"
        check check_f16s "" --pipeline "$F16S"
        built+=(bench_def61 ab_f16s ab_f16n check_f16s) ;;
    cf)
        bench ab_f16s2 --pipeline "$F16S"
        bench ab_f16cf --pipeline "$F16S" --set scan_checkpoints_first=true
        bench ab_cf --set scan_checkpoints_first=true
        check check_f16cf "" --pipeline "$F16S" --lower scan_checkpoints_first=true
        check check_cf "" --lower scan_checkpoints_first=true
        rm -rf .bundles/check_f16p .bundles/check_f16st
        "$PY" -m tools.check_bundle .bundles/check_f16p --set default --pipeline "$F16S" \
            --chips sm_90a > /tmp/check_f16p.log 2>&1
        "$PY" -m tools.check_bundle .bundles/check_f16st --set standin --pipeline "$F16S" \
            --chips sm_90a > /tmp/check_f16st.log 2>&1
        built+=(ab_f16s2 ab_f16cf ab_cf check_f16cf check_cf check_f16p check_f16st) ;;
    k256)
        rm -rf .bundles/check_k256f16
        "$PY" -m tools.check_bundle .bundles/check_k256f16 --set k256 --pipeline "$F16S" \
            --chips sm_90a > /tmp/check_k256f16.log 2>&1
        built+=(check_k256f16) ;;
    *) echo "unknown set $set" >&2; exit 2 ;;
    esac
done
pack "${built[@]}"
