#!/usr/bin/env bash
# GPU calls (prepared at stop 51, run at stop 52): chunk_flags=all with scan_flag_loops=2 against
# chunk_flags=forward (then the default) and chunk_flags=off. Part 1: the GPU check of the native set
# with all+loops2, the overlapped-vs-in-order bits (bench/overlap_determinism.py) with it, and
# B1_T8k_H16 with FLA (per-kernel tables: the reverse scan's in-order us/step must be back at
# ~4.2). Part 2: B1_T32k_H16 and B8_T4k_H32 (in order: scans over half the SMs), no FLA.
# Prepare with  bash bench/prepare_carry.sh wheels ab_flags2 ; carry [".whl", ".gpucarry"].
set -x
part=${1:-1}
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$part" = 1 ]; then
    timeout 180 python3 -m tools.gpu_check .bundles/check_flagsall2 > "$OUT/check_flagsall2.log" 2>&1
    echo "check_rc=$?"; tail -2 "$OUT/check_flagsall2.log"
    KDAGEN_BUNDLE=.bundles/ab_flagsall2 timeout 120 python3 bench/overlap_determinism.py \
        > "$OUT/determinism_flagsall2.log" 2>&1
    echo "determinism_rc=$?"; tail -6 "$OUT/determinism_flagsall2.log"
    timeout 250 python3 -m kdagen.cli bench --bundle forward=.bundles/ab_flagsfwd \
        --bundle all2=.bundles/ab_flagsall2 --bundle off=.bundles/ab_noflags \
        --configs B1_T8k_H16 --kernels --json "$OUT/ab_flags2_b1t8k.json" > "$OUT/ab_flags2_b1t8k.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/ab_flags2_b1t8k.log"
else
    timeout 400 python3 -m kdagen.cli bench --bundle forward=.bundles/ab_flagsfwd \
        --bundle all2=.bundles/ab_flagsall2 --bundle off=.bundles/ab_noflags \
        --configs B1_T32k_H16,B8_T4k_H32 --no-fla --json "$OUT/ab_flags2_more.json" \
        > "$OUT/ab_flags2_more.log" 2>&1
    echo "bench_rc=$?"; grep -A10 "^op |" "$OUT/ab_flags2_more.log"
fi
