#!/usr/bin/env bash
# GPU calls of stop 59 (through bench/gpu_run.sh; carry [".whl", ".gpucarry"]). Bundles:
# bench/calls/stop58_build.sh ns (check_dkns, check_dq1ns, check_defns, ab_ns, and bench_def
# from its set ab) and bench/calls/stop59_build.sh dq (ab_dq2, ab_dq1, ab_dkns).
#   ns    stop 58's prepared call: the full GPU check with register_tile_sums=native of the dk
#         kernel on register tiles, the dq kernel on register tiles, the default kernels
#   dqab  B1_T32k_H16 gdn fwd+bwd, per kernel: def (today's default), ns (default with native
#         sums), dq2 (dq on register tiles beside the 2-WG reverse scan), dq1 (beside the 1-WG
#         one), dkns (the dk kernel on register tiles, 788 B of spill)
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
source "$(dirname "$0")/common.sh"
case "$1" in
ns)
    for b in check_dkns check_dq1ns check_defns; do
        timeout 170 python3 -m tools.gpu_check .bundles/$b > "$OUT/${b}_full.log" 2>&1
        echo "$b rc=$?"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/${b}_full.log" | head -12
    done ;;
dqab)
    timeout 400 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle ns=.bundles/ab_ns \
        --bundle dq2=.bundles/ab_dq2 --bundle dq1=.bundles/ab_dq1 --bundle dkns=.bundles/ab_dkns \
        --ops gdn --modes fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels \
        --kernel-reps 3 --json "$OUT/ab_dq32.json" > "$OUT/ab_dq32.log" 2>&1
    echo "bench_rc=$?"; grep -A7 "^op |" "$OUT/ab_dq32.log"
    grep -E "k[0-9]_scan[0-9] |Error|Traceback" "$OUT/ab_dq32.log" | head -50 ;;
esac
