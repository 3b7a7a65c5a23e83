#!/usr/bin/env bash
# GPU calls of stop 59 (through bench/gpu_run.sh; carry [".whl", ".gpucarry"]). Bundles:
# bench/calls/stop58_build.sh ns (check_dkns, check_dq1ns, check_defns, ab_ns, and bench_def
# from its set ab) and bench/calls/stop59_build.sh dq (ab_dq2, ab_dq1, ab_dkns).
#   ns    stop 58's prepared call: the full GPU check with register_tile_sums=native of the dk
#         kernel on register tiles, the dq kernel on register tiles, the default kernels
#   dqab  B1_T32k_H16 gdn fwd+bwd, per kernel: def (today's default), ns (default with native
#         sums), dq2 (dq on register tiles beside the 2-WG reverse scan), dq1 (beside the 1-WG
#         one)
#   a     the checks of ns without the dk kernel's (check_dq1ns, check_defns), then dqab
#   c2    the GPU check of check_c2 (two chunks per CTA: both GDN prologues and the forward's
#         output kernel), then def / c2 / c2o at B1_T32k_H16, gdn fwd and fwd+bwd
#   all   (one call, for a scarce device) check_dq1ns and check_c2, then def / dq2 / dq1 / c2 at
#         B1_T32k_H16 gdn fwd+bwd, per kernel
#   v2    (one call; bundles of stop59_build.sh v2) the full GPU check of the new default
#         (check_nm) and of the dq kernel on register tiles (check_dq1ns), the quick check of two
#         chunks per CTA (check_c2), then def (stop 58's default) / nm / dq1 / dq2 / c2 at
#         B1_T32k_H16 gdn fwd+bwd, per kernel
#   knobs def / ab_gk4lb2 (gdn) and def / ab_kk4sor (kda) at B1_T32k_H16 fwd+bwd
#   (run directly) def / fsw (the forward and recompute scans on two warpgroups:
#         tune=gdn_fwd.k1_scan1:scan_warpgroups=2,gdn_bwd.k1_scan1:scan_warpgroups=2, bundle
#         ab_fsw built by emit_bench_bundle.py at B1_T8k_H16 --ops gdn) / c2o, and the forward
#         timelines: bench/results/h100_stop59_ab_fsw_c2o.log, h100_stop59_timeline_fsw.log
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
source "$(dirname "$0")/common.sh"
case "$1" in
ns)
    full_checks 170 check_dkns check_dq1ns check_defns ;;
v2)
    full_checks 140 check_nm check_dq1ns
    timeout 60 python3 -m tools.gpu_check .bundles/check_c2 --quick > "$OUT/check_c2_quick.log" 2>&1
    echo "check_c2 rc=$?"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/check_c2_quick.log" | head -12
    timeout 200 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle nm=.bundles/bench_nm \
        --bundle dq1=.bundles/ab_dq1 --bundle dq2=.bundles/ab_dq2 --bundle c2=.bundles/ab_c2 \
        --ops gdn --modes fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 150 --kernels \
        --kernel-reps 3 --json "$OUT/ab_v2.json" > "$OUT/ab_v2.log" 2>&1
    echo "bench_rc=$?"; grep -A7 "^op |" "$OUT/ab_v2.log"
    grep -E "k[0-9]_scan[0-9] |Error|Traceback" "$OUT/ab_v2.log" | head -50 ;;
all)
    full_checks 150 check_dq1ns check_c2
    timeout 240 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle dq2=.bundles/ab_dq2 \
        --bundle dq1=.bundles/ab_dq1 --bundle c2=.bundles/ab_c2 --ops gdn --modes fwdbwd \
        --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels --kernel-reps 3 \
        --json "$OUT/ab_all32.json" > "$OUT/ab_all32.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/ab_all32.log"
    grep -E "k[0-9]_scan[0-9] |Error|Traceback" "$OUT/ab_all32.log" | head -50 ;;
a)
    full_checks 150 check_dq1ns check_defns
    bash "$0" dqab ;;
dqab)
    timeout 230 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle ns=.bundles/ab_ns \
        --bundle dq2=.bundles/ab_dq2 --bundle dq1=.bundles/ab_dq1 \
        --ops gdn --modes fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels \
        --kernel-reps 3 --json "$OUT/ab_dq32.json" > "$OUT/ab_dq32.log" 2>&1
    echo "bench_rc=$?"; grep -A7 "^op |" "$OUT/ab_dq32.log"
    grep -E "k[0-9]_scan[0-9] |Error|Traceback" "$OUT/ab_dq32.log" | head -50 ;;
c2)
    full_checks 150 check_c2 || exit 0
    timeout 230 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle c2=.bundles/ab_c2 \
        --bundle c2o=.bundles/ab_c2o --ops gdn --modes fwd,fwdbwd --configs B1_T32k_H16 \
        --no-fla --rep-ms 200 --kernels --kernel-reps 3 --json "$OUT/ab_c2.json" > "$OUT/ab_c2.log" 2>&1
    echo "bench_rc=$?"; grep -A9 "^op |" "$OUT/ab_c2.log"
    grep -E "k0_scan0 |k2_scan2 |Error|Traceback" "$OUT/ab_c2.log" | head -40 ;;
knobs)
    timeout 120 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle lb2=.bundles/ab_gk4lb2 \
        --ops gdn --modes fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels --kernel-reps 3 \
        --json "$OUT/ab_gk4lb2.json" > "$OUT/ab_gk4lb2.log" 2>&1
    echo "bench_rc=$?"; grep -A3 "^op |" "$OUT/ab_gk4lb2.log"; grep -E "k4_scan4 |Error" "$OUT/ab_gk4lb2.log" | head
    timeout 120 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle sor=.bundles/ab_kk4sor \
        --ops kda --modes fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels --kernel-reps 3 \
        --json "$OUT/ab_kk4sor.json" > "$OUT/ab_kk4sor.log" 2>&1
    echo "bench_rc=$?"; grep -A3 "^op |" "$OUT/ab_kk4sor.log"; grep -E "k4_scan4 |Error" "$OUT/ab_kk4sor.log" | head ;;
esac
