#!/usr/bin/env bash
# GPU calls of stop 55 (through bench/gpu_run.sh; carry [".whl", ".gpucarry"]):
#   rt2   the GPU check of the register-tile lowering with its general rules (check_rt: the
#         native gdn_* set with LowerOptions.register_tiles, gdn_bwd's dq kernel on the path)
#         and of the new default (check_def: gdn_fwd, its prologue and output kernel on the
#         path by the tuning table, the prologue publishing chunk flags); then an A/B at
#         B1_T8k_H16, GDN, kdagen only: base (stop 54's default), new (the tuned default),
#         rt (every kernel that fits on register tiles)
#   fla   the new default (bench_new) against FLA in one process at B1_T8k_H16: GDN forward
#         (FLA's GDN backward needs tilelang, not carried here), KDA forward and fwd+bwd
#   qla   after a call that installed .site1 into /tmp/site (the machine still warm; carry
#         .site2 with .whl and .gpucarry): install .site2, then the new default (bench_new)
#         against FLA and FlashQLA in one process at B1_T8k_H16, GDN fwd and fwd+bwd, and KDA
#         against FLA
#   diag  why gdn_bwd failed at B2_T1 with the general rules (check_rt: 46 ok, 14 FAIL, every
#         gradient but dq): the GPU check of gdn_bwd with register tiles and chunk_flags=off
#         (diag_noflags), with only the dq kernel (diag_k2only) and only the prologue
#         (diag_k0only) on them; then the A/B of stop 54's default (base) against the tuned
#         default with the output kernel alone on register tiles (new2), GDN, B1_T8k_H16
#   w2    (prepared, not run) two consumer warpgroups in the register-tile path: the GPU check
#         of the native gdn_* and kda_fwd sets with register_tiles=true and
#         register_tile_warpgroups=2 (check_w2g, check_w2k), then the A/B of the default
#         (new2) against every kernel that fits on two warpgroups (ab_w2) and the same with
#         the prologues at one CTA per SM (ab_w2one), KDA and GDN, fwd and fwd+bwd
# Prepare: the bundles of the closing note, packed as .gpucarry/NAME.tar.xz
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
checks() {       # checks TIMEOUT BUNDLE...: the quick GPU check of each bundle
    local t=$1; shift
    for b in "$@"; do
        timeout "$t" python3 -m tools.gpu_check .bundles/$b --quick > "$OUT/$b.log" 2>&1
        echo "$b rc=$?"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/$b.log" | head -24
    done
}
case "$1" in
rt2)
    checks 150 check_rt check_def
    timeout 300 python3 -m kdagen.cli bench --bundle base=.bundles/bench --bundle new=.bundles/bench_new \
        --bundle rt=.bundles/ab_rt2 --ops gdn --modes fwd,fwdbwd --configs B1_T8k_H16 --no-fla \
        --rep-ms 100 --kernels --kernel-reps 5 --json "$OUT/rt2.json" > "$OUT/rt2.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/rt2.log"; grep -E "k[0-9]_scan[0-9] |Error" "$OUT/rt2.log" | tail -30 ;;
fla)
    timeout 200 python3 -m kdagen.cli bench --bundle new=.bundles/bench_new --ops gdn --modes fwd \
        --configs B1_T8k_H16 --rep-ms 100 --kernels --kernel-reps 5 --json "$OUT/fla_gdn.json" \
        > "$OUT/fla_gdn.log" 2>&1
    echo "gdn_rc=$?"; grep -A4 "^op |" "$OUT/fla_gdn.log"; tail -3 "$OUT/fla_gdn.log"
    timeout 300 python3 -m kdagen.cli bench --bundle new=.bundles/bench_new --ops kda --modes fwd,fwdbwd \
        --configs B1_T8k_H16 --rep-ms 100 --json "$OUT/fla_kda.json" > "$OUT/fla_kda.log" 2>&1
    echo "kda_rc=$?"; grep -A4 "^op |" "$OUT/fla_kda.log"; tail -3 "$OUT/fla_kda.log" ;;
diag)
    checks 120 diag_noflags diag_k2only diag_k0only
    timeout 240 python3 -m kdagen.cli bench --bundle base=.bundles/bench --bundle new2=.bundles/bench_new2 \
        --ops gdn --modes fwd,fwdbwd --configs B1_T8k_H16 --no-fla --rep-ms 100 --kernels \
        --kernel-reps 5 --json "$OUT/new2.json" > "$OUT/new2.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/new2.log"; grep -E "fwd +k[0-9]_scan[0-9] |Error" "$OUT/new2.log" | tail -30 ;;
fix)
    # after the fix (token rows past the sequence end zeroed in shared memory): the GPU check of
    # every gdn_* kernel on register tiles (check_rt) and of the new default (check_def), then
    # the A/B of stop 54's default against the new one (new2)
    checks 150 check_rt check_def
    timeout 240 python3 -m kdagen.cli bench --bundle base=.bundles/bench --bundle new2=.bundles/bench_new2 \
        --ops gdn --modes fwd,fwdbwd --configs B1_T8k_H16 --no-fla --rep-ms 100 --kernels \
        --kernel-reps 5 --json "$OUT/new2.json" > "$OUT/new2.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/new2.log"; grep -E "fwd +k[0-9]_scan[0-9] |Error" "$OUT/new2.log" | tail -30 ;;
w2)
    checks 200 check_w2g check_w2k
    timeout 300 python3 -m kdagen.cli bench --bundle new2=.bundles/bench_new2 --bundle w2=.bundles/ab_w2 \
        --bundle w2one=.bundles/ab_w2one --ops kda,gdn --modes fwd,fwdbwd --configs B1_T8k_H16 \
        --no-fla --rep-ms 100 --kernels --kernel-reps 5 --json "$OUT/w2.json" > "$OUT/w2.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/w2.log"; grep -E "k[0-9]_scan[0-9] |Error" "$OUT/w2.log" | tail -40 ;;
qla)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .site2/*.whl
    python3 -c "import flash_qla, tilelang; print('flash_qla', flash_qla.__file__)" 2>&1 | tail -2
    timeout 420 python3 -m kdagen.cli bench --bundle new=.bundles/bench_new2 --ops gdn,kda \
        --modes fwd,fwdbwd --configs B1_T8k_H16 --rep-ms 100 --kernels --kernel-reps 5 \
        --json "$OUT/qla.json" > "$OUT/qla.log" 2>&1
    echo "bench_rc=$?"; grep -A8 "^op |" "$OUT/qla.log"; tail -4 "$OUT/qla.log" ;;
esac
