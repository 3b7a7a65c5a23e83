#!/usr/bin/env bash
# GPU calls of stop 58 (through bench/gpu_run.sh; carry [".whl", ".gpucarry"]). Bundles
# (bench/calls/stop58_build.sh ab builds them here):
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
#   dkab   the full GPU check of check_dk (after the fix of the phase waits: the first call's
#          dk kernel hung, waiting for a copy phase at its load op, before the copy was
#          issued), then, if it passes, the gdn part of ab
#   gdnab  the gdn part of ab alone
#   site1  carry [".site1"] alone, NOT through bench/gpu_run.sh: TileLang's wheel into /tmp/site
#   fla    carry [".site2", ".whl", ".gpucarry"], right after site1 on the warm machine:
#          FlashQLA's wheels, then sw (today's default once the tuning table takes the
#          two-warpgroup reverse scans) against FLA and FlashQLA in one process, GDN and KDA,
#          B1_T32k_H16, fwd and fwd+bwd, per kernel
#   kdaab  the kda part of ab
#   ns     (prepared for the next session; bench/calls/stop58_build.sh ns builds its bundles)
#          the full GPU check with register_tile_sums=native of the dk kernel on register
#          tiles (check_dkns), the dq kernel on register tiles (check_dq1ns) and the default
#          kernels (check_defns); then the default against it at B1_T32k_H16 fwd+bwd (gdn)
#   swab   def against sw at B1_T8k_H16 and B8_T4k_H32, gdn and kda, fwd+bwd
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
source "$(dirname "$0")/common.sh"
case "$1" in
check)
    full_checks 170 check_def check_dk check_sw ;;
dkab)
    full_checks 150 check_dk || exit 0
    bash "$0" gdnab ;;
gdnab)
    timeout 280 python3 -m kdagen.cli bench --bundle base=.bundles/bench_base --bundle def=.bundles/bench_def \
        --bundle dk=.bundles/ab_dk --bundle sw=.bundles/ab_sw --ops gdn --modes fwdbwd \
        --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels --kernel-reps 3 \
        --json "$OUT/ab_gdn32.json" > "$OUT/ab_gdn32.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/ab_gdn32.log"; grep -E "k[0-9]_scan[0-9] |Error|Traceback" "$OUT/ab_gdn32.log" | head -40 ;;
swab)
    timeout 250 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle sw=.bundles/ab_sw \
        --ops gdn,kda --modes fwdbwd --configs B1_T8k_H16,B8_T4k_H32 --no-fla --rep-ms 200 --kernels \
        --kernel-reps 3 --json "$OUT/ab_sw.json" > "$OUT/ab_sw.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/ab_sw.log"; grep -E "k3_scan3 |Error|Traceback" "$OUT/ab_sw.log" | head -20 ;;
site1)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .site1/*.whl; echo "site1 rc=$?" ;;
fla)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .site2/*.whl
    python3 -c "import flash_qla, tilelang; print('flash_qla', flash_qla.__file__)" 2>&1 | tail -2
    timeout 470 python3 -m kdagen.cli bench --bundle sw=.bundles/ab_sw \
        --ops gdn,kda --modes fwd,fwdbwd --configs B1_T32k_H16 --rep-ms 100 --kernels \
        --kernel-reps 3 --json "$OUT/fla32.json" > "$OUT/fla32.log" 2>&1
    echo "bench_rc=$?"; grep -A8 "^op |" "$OUT/fla32.log"; tail -4 "$OUT/fla32.log" ;;
ns)
    full_checks 150 check_dkns check_dq1ns check_defns
    timeout 150 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle ns=.bundles/ab_ns \
        --ops gdn --modes fwd,fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels \
        --kernel-reps 3 --json "$OUT/ab_ns.json" > "$OUT/ab_ns.log" 2>&1
    echo "bench_rc=$?"; grep -A4 "^op |" "$OUT/ab_ns.log" ;;
kdaab)
    timeout 200 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle sw=.bundles/ab_sw \
        --ops kda --modes fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels --kernel-reps 3 \
        --json "$OUT/ab_kda32.json" > "$OUT/ab_kda32.log" 2>&1
    echo "bench_rc=$?"; grep -A4 "^op |" "$OUT/ab_kda32.log"; grep -E "k[0-9]_scan[0-9] |Error|Traceback" "$OUT/ab_kda32.log" | head -30 ;;
esac
# bisect of the dk kernel's wrong gate gradients (dg_raw, dA_log, ddt_bias; not bitwise
# repeatable) on register tiles: the check without the sums' re-association (check_dk_nosums),
# without the vectors computed once (check_dk_novec), without both (check_dk_none)
case "$1" in
bisect)
    for b in check_dk_nosums check_dk_novec check_dk_none; do
        timeout 100 python3 -m tools.gpu_check .bundles/$b > "$OUT/${b}.log" 2>&1
        echo "$b rc=$?"; grep -E "SUMMARY|dg_raw|dA_log" "$OUT/${b}.log" | head -8
    done ;;
esac
