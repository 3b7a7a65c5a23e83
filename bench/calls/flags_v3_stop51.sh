#!/usr/bin/env bash
# One GPU call (stop 51): the register scans' producer loop in two versions (with and without
# the flag waits, chosen by the flag pointer): determinism of the overlapped calls against in
# order, then KDA at B1_T8k_H16 end to end and per kernel (in order: the reverse scan's
# us/step), no FLA. Prepare with  bash bench/prepare_carry.sh bench
nvidia-smi --query-gpu=name --format=csv,noheader
KDAGEN_BUNDLE=.bundles/bench timeout 100 python3 bench/overlap_determinism.py --ops kda,gdn \
    --reps 1 > "$OUT/overlap_determinism.log" 2>&1
echo "determinism_rc=$?"; tail -4 "$OUT/overlap_determinism.log"
timeout 100 python3 -m kdagen.cli bench --bundle flags=.bundles/bench --configs B1_T8k_H16 \
    --ops kda,gdn --kernels --no-fla --kernel-reps 10 --rep-ms 200 --json "$OUT/flags_v3.json" \
    > "$OUT/flags_v3.log" 2>&1
echo "bench_rc=$?"; grep -A5 "^op |" "$OUT/flags_v3.log"; grep -E "fwdbwd +k[13]_scan" "$OUT/flags_v3.log"
