#!/usr/bin/env bash
# GPU call (stop 52, with little device time left): the GPU check with scan_slot_barriers=true
# (acquired by products, the default acquire), then default / slots / slotsp per-kernel tables at B1_T32k_H4
# only, no FLA. Prepare as for bench/calls/slots_stop52.sh.
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 80 python3 -m tools.gpu_check .bundles/check_slotsp > "$OUT/check_slotsp.log" 2>&1
echo "check_rc=$?"; tail -1 "$OUT/check_slotsp.log"
timeout 100 python3 -m kdagen.cli bench --bundle default=.bundles/bench --bundle slots=.bundles/ab_slots \
    --bundle slotsp=.bundles/ab_slotsp --bundle opreads=.bundles/ab_opreads --configs B1_T32k_H4 --no-fla --kernels \
    --json "$OUT/slots_lean.json" > "$OUT/slots_lean.log" 2>&1
echo "bench_rc=$?"; grep -A12 "^op |" "$OUT/slots_lean.log"
grep -E "scan3" "$OUT/slots_lean.log" | grep fwdbwd
