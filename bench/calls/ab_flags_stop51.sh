#!/usr/bin/env bash
# GPU calls (stop 51): chunk-ready flags (a register scan beside the chunk kernel that feeds
# it, kdagen.codegen.lower.chunk_flags). Part 1: the GPU check of the native set (today's check
# bundle: the default, chunk_flags=forward; stop 51 checked it under chunk_flags=true, now
# "all"), the overlapped-vs-in-order bits, then KDA and GDN at B1_T8k_H16 in one process with
# FLA: ab_flagsall (both of the backward's pairs overlapped) against ab_noflags
# (chunk_flags=false), per-kernel tables, and B1_T32k_H16 without FLA. Part 2: the
# same at B1_T32k_H16, and bench with KDAGEN_OVERLAP=0 (the same kernels in order on one
# stream: what the flag code itself costs). Prepare with
#   bash bench/prepare_carry.sh wheels ab_flags check
# (stop 51 ran it with .bundles/bench emitted under chunk_flags=true, what ab_flagsall is now)
# and run through bench/gpu_run.sh with carry [".whl", ".gpucarry"]:
#   bash bench/gpu_run.sh 'bash bench/calls/ab_flags_stop51.sh 1'   (then 2). Outputs in $OUT.
set -x
part=${1:-1}
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$part" = 1 ]; then
    timeout 180 python3 -m tools.gpu_check .bundles/check > "$OUT/check_flags.log" 2>&1
    echo "check_rc=$?"; tail -3 "$OUT/check_flags.log"; grep -ciE "FAIL" "$OUT/check_flags.log"
    KDAGEN_BUNDLE=.bundles/ab_flagsall timeout 120 python3 bench/overlap_determinism.py \
        > "$OUT/overlap_determinism.log" 2>&1
    echo "determinism_rc=$?"; cat "$OUT/overlap_determinism.log" | tail -8
    cfg=B1_T8k_H16
else
    KDAGEN_OVERLAP=0 timeout 150 python3 -m kdagen.cli bench --bundle inorder=.bundles/ab_flagsall \
        --configs B1_T8k_H16,B1_T32k_H16 --no-fla --json "$OUT/ab_flags_inorder.json" \
        > "$OUT/ab_flags_inorder.log" 2>&1
    echo "inorder_rc=$?"; head -20 "$OUT/ab_flags_inorder.log"
    cfg=B1_T32k_H16
fi
timeout 280 python3 -m kdagen.cli bench --bundle flags=.bundles/ab_flagsall \
    --bundle noflags=.bundles/ab_noflags --configs $cfg --kernels \
    --json "$OUT/ab_flags_$cfg.json" > "$OUT/ab_flags_$cfg.log" 2>&1
echo "bench_rc=$?"; head -30 "$OUT/ab_flags_$cfg.log"
if [ "$part" = 1 ]; then      # B1_T32k_H16 without FLA (its times: stop 50's note)
    timeout 100 python3 -m kdagen.cli bench --bundle flags=.bundles/ab_flagsall \
        --bundle noflags=.bundles/ab_noflags --configs B1_T32k_H16 --no-fla \
        --json "$OUT/ab_flags_B1_T32k_H16_nofla.json" > "$OUT/ab_flags_B1_T32k_H16_nofla.log" 2>&1
    echo "t32k_rc=$?"; grep -A8 "^op |" "$OUT/ab_flags_B1_T32k_H16_nofla.log"
fi
