#!/usr/bin/env bash
# GPU call (stop 52): the GPU check with scan_slot_barriers=true, then the default lowering
# (chunk_flags=all) and slot barriers (acquired at the step start; slotsp: the products'
# slots before their first read) against FLA in one process with per-kernel tables:
# B1_T8k_H16 (the headline) and B1_T32k_H4 (few heads: the scans pace the call). Part 2: the
# other few-head configs and B1_T32k_H16.
# Prepare with  bash bench/prepare_carry.sh wheels bench ab_slots ; carry [".whl", ".gpucarry"].
set -x
part=${1:-1}
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$part" = 1 ]; then
    for c in check_slots check_slotsp; do
        timeout 120 python3 -m tools.gpu_check .bundles/$c > "$OUT/$c.log" 2>&1
        echo "${c}_rc=$?"; tail -1 "$OUT/$c.log"
    done
    configs=B1_T8k_H16,B1_T32k_H4
else
    configs=B1_T32k_H2,B1_T32k_H8,B1_T32k_H16
fi
timeout 420 python3 -m kdagen.cli bench --bundle default=.bundles/bench --bundle slots=.bundles/ab_slots \
    --bundle slotsp=.bundles/ab_slotsp \
    --configs "$configs" --kernels --json "$OUT/slots_$part.json" > "$OUT/slots_$part.log" 2>&1
echo "bench_rc=$?"; grep -A12 "^op |" "$OUT/slots_$part.log"
grep -E "k3_scan3" "$OUT/slots_$part.log"
