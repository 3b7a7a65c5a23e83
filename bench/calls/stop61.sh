#!/usr/bin/env bash
# GPU calls prepared at stop 60 for the next session (through bench/gpu_run.sh; carry
# [".whl", ".gpucarry"]). Bundles, built here: bench_def60 and ab_f16c
# (bash bench/calls/stop60_build.sh f16c).
#   ncu2    warp-stall sources of gdn_fwd's register-tile prologue and output kernel (B1_T8k_H16),
#           with fp32 and with fp16 checkpoints: what the bandwidth-bound forward's chunk
#           kernels wait on (stop 60 has the state scan's and the dq kernel's). Read here with
#           python -m tools.ncu_hotspots FILE.csv [--memory]
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
case "$1" in
ncu2)
    NCU="ncu --clock-control none -c 1 --section WarpStateStats --section SourceCounters --page source --print-source sass --csv"
    for b in def60 f16c; do
        bundle=.bundles/bench_def60; [ $b = f16c ] && bundle=.bundles/ab_f16c
        for k in k0_scan0 k2_scan2; do
            timeout 120 $NCU -k regex:$k python3 bench/one_call.py $bundle --op gdn --config B1_T8k_H16 \
                --calls 1 > "$OUT/ncu_gdn_fwd_${k}_$b.csv" 2> "$OUT/ncu_gdn_fwd_${k}_$b.err"
            echo "$b $k rc=$?"; tail -2 "$OUT/ncu_gdn_fwd_${k}_$b.err"
        done
    done
    xz -9 "$OUT"/ncu_*.csv; ls -la "$OUT" ;;
esac
