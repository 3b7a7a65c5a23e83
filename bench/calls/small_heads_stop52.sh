#!/usr/bin/env bash
# GPU call (stop 52): the default lowering (chunk_flags=all) against FLA in one process, with
# per-kernel tables: B1_T8k_H16 (the headline) and the few-head configs B1_T32k_H{2,4,8}
# (issue 12 item 5), where the serial scans run on a handful of SMs.
# Prepare with  bash bench/prepare_carry.sh wheels bench ; carry [".whl", ".gpucarry"].
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
configs=${1:-B1_T8k_H16,B1_T32k_H2,B1_T32k_H4,B1_T32k_H8}
timeout 540 python3 -m kdagen.cli bench --bundle kdagen=.bundles/bench --configs "$configs" \
    --kernels --json "$OUT/small_heads.json" > "$OUT/small_heads.log" 2>&1
echo "bench_rc=$?"; grep -A12 "^op |" "$OUT/small_heads.log"
