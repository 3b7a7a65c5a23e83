#!/usr/bin/env bash
# GPU calls of stop 58 (through bench/gpu_run.sh; carry [".whl", ".gpucarry"]). Bundles
# (bench/calls/stop58_build.sh builds them here):
#   bench_base  gdn at B1_T8k_H16 built from stop 57's code (f7baa44): the A/B baseline
#   bench_def   today's default (gdn and kda): register-tile accumulator ops read broadcasts
#               once per row, f32 ring tiles read 16 bytes at a time
#   ab_dk       gdn with its dk kernel on register tiles, two warpgroups (the tight plan:
#               tune=gdn_bwd.k4_scan4:register_tiles=true+register_tile_warpgroups=2)
#   ab_sw       both reverse scans on two warpgroups per CTA, one CTA per head
#               (tune=gdn_bwd.k3_scan3:scan_warpgroups=2,kda_bwd.k3_scan3:scan_warpgroups=2)
#   check_def, check_dk, check_sw: the GPU check's native set (gdn_*, gdn_bwd, *_bwd) with them
#   check  the full GPU check of check_def, check_dk and check_sw
#   ab     B1_T32k_H16 fwd+bwd, per kernel: gdn base / def / dk / sw, kda def / sw
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
source "$(dirname "$0")/common.sh"
case "$1" in
check)
    for b in check_def check_dk check_sw; do
        timeout 170 python3 -m tools.gpu_check .bundles/$b > "$OUT/${b}_full.log" 2>&1
        echo "$b rc=$?"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/${b}_full.log" | head -20
    done ;;
ab)
    timeout 280 python3 -m kdagen.cli bench --bundle base=.bundles/bench_base --bundle def=.bundles/bench_def \
        --bundle dk=.bundles/ab_dk --bundle sw=.bundles/ab_sw --ops gdn --modes fwdbwd \
        --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels --kernel-reps 3 \
        --json "$OUT/ab_gdn32.json" > "$OUT/ab_gdn32.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/ab_gdn32.log"; grep -E "k[0-9]_scan[0-9] |Error|Traceback" "$OUT/ab_gdn32.log" | head -40
    timeout 200 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle sw=.bundles/ab_sw \
        --ops kda --modes fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels --kernel-reps 3 \
        --json "$OUT/ab_kda32.json" > "$OUT/ab_kda32.log" 2>&1
    echo "bench_rc=$?"; grep -A4 "^op |" "$OUT/ab_kda32.log"; grep -E "k[0-9]_scan[0-9] |Error|Traceback" "$OUT/ab_kda32.log" | head -30 ;;
esac
