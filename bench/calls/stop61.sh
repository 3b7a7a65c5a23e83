#!/usr/bin/env bash
# GPU calls prepared at stop 60 for the next session (through bench/gpu_run.sh; carry
# [".whl", ".gpucarry"]). Bundles, built here: bench_def60 and ab_f16c
# (bash bench/calls/stop60_build.sh f16c).
#   ncu2    warp-stall sources of gdn_fwd's register-tile prologue and output kernel (B1_T8k_H16),
#           with fp32 and with fp16 checkpoints: what the bandwidth-bound forward's chunk
#           kernels wait on (stop 60 has the state scan's and the dq kernel's). Read here with
#           python -m tools.ncu_hotspots FILE.csv [--memory]
#   f16s    fp16 checkpoints with their column scale on the register paths (bash
#           bench/calls/stop61_build.sh f16s): the full GPU check of every program
#           (check_f16s), then today's default (def61) against scaled (f16s) and unscaled
#           (f16n) fp16 checkpoints, gdn and kda, fwd and fwd+bwd, B1_T32k_H16 and B8_T4k_H32,
#           with the per-kernel table
#   cf      (bash bench/calls/stop61_build.sh f16s cf) the full GPU checks of scaled fp16
#           checkpoints with the checkpoints stored first (check_f16cf), fp32 checkpoints stored
#           first (check_cf), and scaled fp16 on the portable (check_f16p) and stand-in
#           (check_f16st) sets; then def61 against f16s2, f16cf and cf, gdn and kda, fwd and
#           fwd+bwd, B1_T32k_H16 and B8_T4k_H32, with the per-kernel table
set -x
source bench/calls/common.sh
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
f16s)
    full_checks 300 check_f16s
    ab ab_f16s 240 120 def61=.bundles/bench_def61 f16s=.bundles/ab_f16s f16n=.bundles/ab_f16n ;;
cf)
    full_checks 200 check_f16cf check_cf
    full_checks 300 check_f16p check_f16st
    ab ab_cf 280 120 def61=.bundles/bench_def61 f16s2=.bundles/ab_f16s2 f16cf=.bundles/ab_f16cf \
        cf=.bundles/ab_cf ;;
cf2)    # (bash bench/calls/stop61_build.sh f16s cf k256) cf without the fp32 checkpoints stored
        # first, with the K = 256 set in scaled fp16 (check_k256f16)
    full_checks 200 check_f16cf check_k256f16
    full_checks 300 check_f16p check_f16st
    ab ab_cf 200 100 def61=.bundles/bench_def61 f16s2=.bundles/ab_f16s2 f16cf=.bundles/ab_f16cf ;;
esac
