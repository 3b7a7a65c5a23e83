#!/usr/bin/env bash
# GPU call (stop 52): register scans that commit and wait for their wgmma groups where ptxas
# would insert the wait itself (LowerOptions.scan_group_wait). Part 1: the GPU check of the
# native set with chunk_flags=all, and B1_T8k_H16 with FLA and per-kernel tables (the reverse
# scan's in-order us/step with all must be back at ~4.06). Part 2: B1_T32k_H16 and B8_T4k_H32.
# Prepare with  bash bench/prepare_carry.sh wheels ab_wait ; carry [".whl", ".gpucarry"].
set -x
part=${1:-1}
nvidia-smi --query-gpu=name --format=csv,noheader
bundles="--bundle fwd=.bundles/ab_waitfwd --bundle all=.bundles/ab_waitall --bundle nowait=.bundles/ab_nowait"
if [ "$part" = 1 ]; then
    timeout 180 python3 -m tools.gpu_check .bundles/check_waitall > "$OUT/check_waitall.log" 2>&1
    echo "check_rc=$?"; tail -2 "$OUT/check_waitall.log"
    timeout 300 python3 -m kdagen.cli bench $bundles --configs B1_T8k_H16 --kernels \
        --json "$OUT/ab_wait_b1t8k.json" > "$OUT/ab_wait_b1t8k.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/ab_wait_b1t8k.log"
    grep -E "k1_scan1|k3_scan3" "$OUT/ab_wait_b1t8k.log" | grep fwdbwd
else
    timeout 400 python3 -m kdagen.cli bench $bundles --configs B1_T32k_H16,B8_T4k_H32 --no-fla \
        --json "$OUT/ab_wait_more.json" > "$OUT/ab_wait_more.log" 2>&1
    echo "bench_rc=$?"; grep -A10 "^op |" "$OUT/ab_wait_more.log"
fi
