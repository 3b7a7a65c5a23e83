#!/usr/bin/env bash
# GPU calls of stop 57 (through bench/gpu_run.sh; carry [".whl", ".gpucarry"]):
#   fold   kda-fold-row-decay (GDN's row-gate decay_matmuls as plain dots of precomputed
#          weights): the full GPU check of gdn_* with it (check_def2: python -m
#          tools.check_bundle .bundles/check_def2 --set native --pipeline chip --chips sm_90a
#          --only gdn_), the API GPU tests through the eager autograd path
#          (KDAGEN_EAGER_AUTOGRAD=1, bundle api: bash bench/prepare_carry.sh api), then GDN at
#          B1_T32k_H16 with the fold (def: bench/emit_bench_bundle.py .bundles/bench_def --path
#          native --configs B1_T8k_H16) against without it (nofold: the same with --ops gdn
#          --pipeline 'chip+kda-fold-row-decay{fold=false}'), per kernel
#   kdaw2  KDA's forward kernels on two warpgroups after the split gate cumsum: the GPU check
#          of kda_* on them (check_w2k: tools.check_bundle ... --only kda_ --lower
#          register_tiles=true --lower register_tile_warpgroups=2), the A/B at B1_T32k_H16 of
#          the default (def) against KDA's output kernel on them (kout: --ops kda --set
#          tune=kda_fwd.k2_scan2:W) and both forward kernels at one CTA per SM (kboth: --set
#          tune=kda_fwd.k2_scan2:W,kda_fwd.k0_scan0:W+register_tile_ctas_per_sm=1), W =
#          register_tiles=true+register_tile_warpgroups=2; then the host time per layer with
#          and without the eager autograd path
#   site1  carry [".site1"] alone, NOT through bench/gpu_run.sh: TileLang's wheel into /tmp/site
#   fla    carry [".site2", ".whl", ".gpucarry"], right after site1 on the warm machine:
#          FlashQLA's wheels, then the default (def) against FLA and FlashQLA in one process,
#          GDN and KDA, B1_T8k_H16 and B1_T32k_H16, fwd and fwd+bwd, per kernel
# After the fold's mask moved behind the weighting (tril(w ⊙ E)), in three calls on one warm
# machine:
#   site1c carry [".site1", ".whl", ".gpucarry/check_def2.tar.xz", ".gpucarry/check_dq1.tar.xz"],
#          NOT through bench/gpu_run.sh: TileLang's wheel into /tmp/site, then (through
#          gpu_run.sh) the full GPU check of gdn_* (check_def2) and of gdn_bwd with its dq
#          kernel on two warpgroups padded to one CTA per SM (check_dq1: tools.check_bundle
#          ... --only gdn_bwd --lower tune=gdn_bwd.k2_scan2:W1, W1 = W+register_tile_ctas_per_sm=1)
#   fla32  carry [".site2", ".whl", ".gpucarry"]: FlashQLA's wheels, the timelines of the
#          default (def) and the dq candidate (dq1: emit_bench_bundle ... --ops gdn --set
#          tune=gdn_bwd.k2_scan2:W1) at B1_T32k_H16 fwd+bwd, then both against FLA and FlashQLA
#          (GDN) and def against FLA (KDA) at B1_T32k_H16, per kernel
#   fla8   carry [".whl", ".gpucarry"]: the API GPU tests (bundle api), then def against FLA
#          and FlashQLA at B1_T8k_H16 (the eager autograd path on: host enqueue per call)
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
source "$(dirname "$0")/common.sh"
case "$1" in
fold)
    timeout 240 python3 -m tools.gpu_check .bundles/check_def2 > "$OUT/check_def2_full.log" 2>&1
    echo "check rc=$?"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/check_def2_full.log" | head -30
    KDAGEN_EAGER_AUTOGRAD=1 KDAGEN_BUNDLE=.bundles/api timeout 150 python3 -m pytest -q -n 0 \
        tests/test_api_gpu.py > "$OUT/api_gpu_eager.log" 2>&1
    echo "api_gpu_eager rc=$?"; tail -8 "$OUT/api_gpu_eager.log"
    timeout 150 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle nofold=.bundles/ab_nofold \
        --ops gdn --modes fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels \
        --kernel-reps 3 --json "$OUT/fold32.json" > "$OUT/fold32.log" 2>&1
    echo "bench_rc=$?"; grep -A3 "^op |" "$OUT/fold32.log"; grep -E "k[0-9]_scan[0-9] |Error|Traceback" "$OUT/fold32.log" | head -30 ;;
kdaw2)
    checks 200 check_w2k
    timeout 200 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle kout=.bundles/ab_kout \
        --bundle kboth=.bundles/ab_kboth --ops kda --modes fwd --configs B1_T32k_H16 \
        --no-fla --rep-ms 200 --kernels --kernel-reps 3 --json "$OUT/kdaw2.json" > "$OUT/kdaw2.log" 2>&1
    echo "bench_rc=$?"; grep -A4 "^op |" "$OUT/kdaw2.log"; grep -E "k[0-9]_scan[0-9] " "$OUT/kdaw2.log"
    for e in 1 0; do
        KDAGEN_EAGER_AUTOGRAD=$e layers "layers_e$e" 60 "gdn fwdbwd" "kda fwdbwd"
    done ;;
site1)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .site1/*.whl; echo "site1 rc=$?" ;;
fla)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .site2/*.whl
    python3 -c "import flash_qla, tilelang; print('flash_qla', flash_qla.__file__)" 2>&1 | tail -2
    timeout 500 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def \
        --ops gdn,kda --modes fwd,fwdbwd --configs B1_T8k_H16,B1_T32k_H16 --rep-ms 100 --kernels \
        --kernel-reps 3 --json "$OUT/fla.json" > "$OUT/fla.log" 2>&1
    echo "bench_rc=$?"; grep -A12 "^op |" "$OUT/fla.log"; tail -4 "$OUT/fla.log" ;;
site1c)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .site1/*.whl; echo "site1 rc=$?"
    bash bench/gpu_run.sh 'source bench/calls/common.sh
        for b in check_def2 check_dq1; do
            timeout 200 python3 -m tools.gpu_check .bundles/$b > "$OUT/${b}_full.log" 2>&1
            echo "$b rc=$?"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/${b}_full.log" | head -20
        done' ;;
fla32)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .site2/*.whl
    python3 -c "import flash_qla, tilelang; print('flash_qla', flash_qla.__file__)" 2>&1 | tail -2
    timeout 100 python3 bench/overlap_timeline.py --bundle def=.bundles/bench_def \
        --bundle dq1=.bundles/ab_dq1 --ops gdn --modes fwdbwd --configs B1_T32k_H16 --reps 3 \
        --json "$OUT/timeline32.json" > "$OUT/timeline32.log" 2>&1
    echo "timeline_rc=$?"; tail -40 "$OUT/timeline32.log"
    timeout 300 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle dq1=.bundles/ab_dq1 \
        --ops gdn --modes fwd,fwdbwd --configs B1_T32k_H16 --rep-ms 100 --kernels \
        --kernel-reps 3 --json "$OUT/fla32_gdn.json" > "$OUT/fla32_gdn.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/fla32_gdn.log"; grep -E "k[0-9]_scan[0-9] " "$OUT/fla32_gdn.log" | grep kdagen
    timeout 150 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def \
        --ops kda --modes fwd,fwdbwd --configs B1_T32k_H16 --rep-ms 100 --kernels \
        --kernel-reps 3 --json "$OUT/fla32_kda.json" > "$OUT/fla32_kda.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/fla32_kda.log" ;;
fla8)
    KDAGEN_BUNDLE=.bundles/api timeout 120 python3 -m pytest -q -n 0 tests/test_api_gpu.py \
        > "$OUT/api_gpu.log" 2>&1
    echo "api_gpu rc=$?"; tail -2 "$OUT/api_gpu.log"
    timeout 400 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def \
        --ops gdn,kda --modes fwd,fwdbwd --configs B1_T8k_H16 --rep-ms 100 \
        --json "$OUT/fla8.json" > "$OUT/fla8.log" 2>&1
    echo "bench_rc=$?"; grep -A8 "^op |" "$OUT/fla8.log"; tail -3 "$OUT/fla8.log" ;;
esac
