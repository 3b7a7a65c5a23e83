#!/usr/bin/env bash
# GPU calls of stop 54 (run through bench/gpu_run.sh; carry [".whl", ".gpucarry"] plus the
# reference wheels of bench/reference_wheels.sh where named):
#   tests  the segments GPU tests with their errors printed (-n 0): varlen and beside cases
#   cp     intra-card CP A/B in one process with FLA: auto rule (cp), off (nocp), beside (side)
#          at B1_T32k_H4 and B1_T32k_H2, KDA and GDN
#   gdn    GDN against FLA and FlashQLA (needs .site1 then .site2 installed into /tmp/site)
#   rt     the register-tile lowering (LowerOptions.register_tiles: GDN's prologues and output
#          kernel, KDA's output kernel): the GPU check of the native set of gdn_* (check_rt)
#          and kda_fwd (check_rtk) with it, and an A/B of the default bench bundle against it
#          (ab_rt) at B1_T8k_H16, kdagen only
# Prepare with  bash bench/prepare_carry.sh wheels segments bench
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
rt_checks() {    # rt_checks TIMEOUT: the quick GPU check of both register-tile bundles
    for b in check_rt check_rtk; do
        timeout "$1" python3 -m tools.gpu_check .bundles/$b --quick > "$OUT/$b.log" 2>&1
        echo "$b rc=$?"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/$b.log" | head -24
    done
}
rt_bench() {     # rt_bench TIMEOUT MODES REP_MS: default bundle vs register tiles, kdagen only
    timeout "$1" python3 -m kdagen.cli bench --bundle base=.bundles/bench --bundle rt=.bundles/ab_rt \
        --ops kda,gdn --modes "$2" --configs B1_T8k_H16 --no-fla --rep-ms "$3" \
        --kernels --kernel-reps 5 --json "$OUT/rt.json" > "$OUT/rt.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/rt.log"; grep -E " fwd .*k[0-2]_scan[0-2] |Error" "$OUT/rt.log" | tail -16
}
case "$1" in
tests)
    KDAGEN_BUNDLE=.bundles/segments timeout 240 python3 -m pytest -q -s -n 0 -p no:cacheprovider \
        tests/test_segments_gpu.py > "$OUT/test_segments_gpu.log" 2>&1
    echo "segments_rc=$?"; grep -E "segment|passed|failed|Error|assert|err" "$OUT/test_segments_gpu.log" | tail -60 ;;
cp)
    timeout 420 python3 -m kdagen.cli bench --bundle cp=.bundles/bench --bundle nocp=.bundles/bench \
        --bundle side=.bundles/bench --segments side=beside --segments nocp=off \
        --configs B1_T32k_H4,B1_T32k_H2 --modes fwdbwd --rep-ms 150 --kernels --kernel-reps 5 \
        --json "$OUT/cp.json" > "$OUT/cp.log" 2>&1
    echo "bench_rc=$?"; grep -B2 -A8 "^op |" "$OUT/cp.log"; tail -3 "$OUT/cp.log" ;;
gdn)
    python3 -c "import flash_qla, tilelang; print('flash_qla', flash_qla.__file__)" 2>&1 | tail -2
    timeout 520 python3 -m kdagen.cli bench --ops gdn --configs B1_T8k_H16,gva_H4_HV16_T8k \
        --bundle main=.bundles/bench --rep-ms 150 --json "$OUT/gdn.json" > "$OUT/gdn.log" 2>&1
    echo "bench_rc=$?"; grep -A8 "^op |" "$OUT/gdn.log"; tail -5 "$OUT/gdn.log" ;;
rt)      rt_checks 200; rt_bench 280 fwd,fwdbwd 100 ;;
rtmin)   rt_checks 90; rt_bench 100 fwd 60 ;;       # within little device time
checkmin) rt_checks 100 ;;                        # the GPU check alone
esac
