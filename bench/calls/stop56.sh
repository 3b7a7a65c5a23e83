#!/usr/bin/env bash
# GPU calls of stop 56 (through bench/gpu_run.sh; carry [".whl", ".gpucarry"]):
#   order  the launch order of the overlapped pairs and GDN's chunk kernels on two consumer
#          warpgroups: the GPU check of gdn_* with the scans launched first and GDN's
#          prologues and dq kernel on two warpgroups (check_gsf); then the A/B at B1_T8k_H16
#          of the default (new2) against the scans launched first (sf), the dq kernel alone on
#          two warpgroups (gdq), GDN's prologues and dq kernel on two warpgroups with the
#          chunk kernel launched first (gall) and with the scan first (gall_sf)
# Prepare (bench/emit_bench_bundle.py ... --path native --configs B1_T8k_H16, packed as
# .gpucarry/NAME.tar.xz): bench_new2 (no --set), ab_sf (--set overlap_order=scan), ab_gdq
# (--ops gdn --set tune=gdn_bwd.k2_scan2:W), ab_gall (--ops gdn --set
# tune=gdn_bwd.k2_scan2:W,gdn_bwd.k0_scan0:W,gdn_fwd.k0_scan0:W), ab_gall_sf (the same and
# --set overlap_order=scan), with W = register_tiles=true+register_tile_warpgroups=2;
# check_gsf: python -m tools.check_bundle .bundles/check_gsf --set native --pipeline chip
# --chips sm_90a --only gdn_ --lower overlap_order=scan --lower tune=(gall's)
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
source "$(dirname "$0")/common.sh"
case "$1" in
order)
    checks 150 check_gsf
    timeout 300 python3 -m kdagen.cli bench --bundle new2=.bundles/bench_new2 --bundle sf=.bundles/ab_sf \
        --bundle gdq=.bundles/ab_gdq --bundle gall=.bundles/ab_gall --bundle gall_sf=.bundles/ab_gall_sf \
        --ops gdn,kda --modes fwd,fwdbwd --configs B1_T8k_H16 --no-fla --rep-ms 100 --kernels \
        --kernel-reps 5 --json "$OUT/order.json" > "$OUT/order.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/order.log"; grep -E "Error|Traceback" "$OUT/order.log" | tail ;;
cand)
    # after the fix (a reverse group's register-tile CTAs take the last chunk first, so the
    # reverse scan beside the dq kernel overlaps it): the GPU check of gdn_* with the
    # candidates (check_cand: the dq kernel on two warpgroups, both prologues on two
    # warpgroups at one CTA per SM), the A/B of the default (new2) against the dq kernel alone
    # (gdq2), the candidates (cand) and the candidates with the scans launched first
    # (cand_sf), and the timeline of each call (bench/overlap_timeline.py)
    checks 150 check_cand
    timeout 240 python3 -m kdagen.cli bench --bundle new2=.bundles/bench_new2 --bundle gdq2=.bundles/ab_gdq2 \
        --bundle cand=.bundles/ab_cand --bundle cand_sf=.bundles/ab_cand_sf \
        --ops gdn --modes fwd,fwdbwd --configs B1_T8k_H16 --no-fla --rep-ms 100 --kernels \
        --kernel-reps 5 --json "$OUT/cand.json" > "$OUT/cand.log" 2>&1
    echo "bench_rc=$?"; grep -A4 "^op |" "$OUT/cand.log"; grep -E "Error|Traceback" "$OUT/cand.log" | tail
    timeout 200 python3 bench/overlap_timeline.py --bundle new2=.bundles/bench_new2 \
        --bundle gdq2=.bundles/ab_gdq2 --bundle cand=.bundles/ab_cand --bundle cand_sf=.bundles/ab_cand_sf \
        --bundle sf=.bundles/ab_sf --ops gdn,kda --json "$OUT/timeline.json" > "$OUT/timeline.log" 2>&1
    echo "timeline_rc=$?"; cat "$OUT/timeline.log" | head -150 ;;
host)
    # where the host time of a call goes (cProfile; at B1_T8k_H16 the host enqueue time of a
    # call nears its GPU time), then the candidates' A/B at B1_T32k_H16 (four times the GPU
    # time per call, the same host time)
    for m in fwd fwdbwd; do
        timeout 120 python3 bench/host_profile.py --bundle .bundles/bench_new2 --op gdn --mode $m \
            --calls 100 --top 45 --json "$OUT/host_gdn_$m.json" > "$OUT/host_gdn_$m.log" 2>&1
        echo "host_$m rc=$?"; head -60 "$OUT/host_gdn_$m.log"
    done
    timeout 300 python3 -m kdagen.cli bench --bundle new2=.bundles/bench_new2 --bundle gdq2=.bundles/ab_gdq2 \
        --bundle cand=.bundles/ab_cand --bundle cand_sf=.bundles/ab_cand_sf \
        --ops gdn --modes fwd,fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 200 --kernels \
        --kernel-reps 3 --json "$OUT/cand32.json" > "$OUT/cand32.log" 2>&1
    echo "bench_rc=$?"; grep -A4 "^op |" "$OUT/cand32.log"; grep -E "Error|Traceback" "$OUT/cand32.log" | tail ;;
ff)
    # why the dq kernel on two warpgroups slows the backward (B1_T32k_H16: the kernel alone
    # 2258 -> 1554 us, fwd+bwd 10.55 -> 11.49 ms): the candidates with the dq kernel and the
    # reverse scan in order (cand_ff: chunk_flags=forward) against cand and new2, and the
    # timelines of the three at B1_T32k_H16
    timeout 200 python3 -m kdagen.cli bench --bundle new2=.bundles/bench_new2 --bundle cand=.bundles/ab_cand \
        --bundle cand_ff=.bundles/ab_gdq2_ff --ops gdn --modes fwdbwd --configs B1_T32k_H16 --no-fla \
        --rep-ms 200 --json "$OUT/ff32.json" > "$OUT/ff32.log" 2>&1
    echo "bench_rc=$?"; grep -A3 "^op |" "$OUT/ff32.log"
    timeout 200 python3 bench/overlap_timeline.py --bundle new2=.bundles/bench_new2 \
        --bundle cand=.bundles/ab_cand --bundle cand_ff=.bundles/ab_gdq2_ff --ops gdn --modes fwdbwd \
        --configs B1_T32k_H16 --reps 5 --json "$OUT/timeline32.json" > "$OUT/timeline32.log" 2>&1
    echo "timeline_rc=$?"; cat "$OUT/timeline32.log" ;;
site1)
    # carry [".site1"] alone (the tree and .site1 are ~63 MiB): TileLang's wheels into
    # /tmp/site, for def2 on the still-warm machine
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .site1/*.whl; echo "site1 rc=$?" ;;
def2)
    # carry [".site2", ".whl", ".gpucarry"], after site1: FlashQLA; the GPU check of the new
    # default (check_def2: GDN's prologues on two warpgroups at one CTA per SM); then the new
    # default (def) and stop 55's (new2) against FLA and FlashQLA in one process, GDN and KDA,
    # B1_T8k_H16 and B1_T32k_H16, fwd and fwd+bwd
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .site2/*.whl
    python3 -c "import flash_qla, tilelang; print('flash_qla', flash_qla.__file__)" 2>&1 | tail -2
    checks 100 check_def2
    timeout 450 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle new2=.bundles/bench_new2 \
        --ops gdn,kda --modes fwd,fwdbwd --configs B1_T8k_H16,B1_T32k_H16 --rep-ms 100 --kernels \
        --kernel-reps 3 --json "$OUT/fla.json" > "$OUT/fla.log" 2>&1
    echo "bench_rc=$?"; grep -A12 "^op |" "$OUT/fla.log"; tail -4 "$OUT/fla.log" ;;
layers)
    # the host time per layer of a call (bench/host_layers.py), the new default's bundle
    layers layers 100 "gdn fwd" "gdn fwdbwd" "kda fwd" "kda fwdbwd" ;;
host2)
    # after the launcher's host-time changes (a preallocated parameter array per kernel, map
    # cache keys read straight off the tensor, workspaces as one strided view each): the GPU
    # check of the default (check_def2) through the new launcher, the host time per layer
    # again, and the default at B1_T8k_H16 (kdagen only)
    checks 100 check_def2
    layers layers2 100 "gdn fwd" "gdn fwdbwd" "kda fwdbwd"
    timeout 150 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --ops gdn,kda \
        --modes fwd,fwdbwd --configs B1_T8k_H16 --no-fla --rep-ms 100 --json "$OUT/host2.json" \
        > "$OUT/host2.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/host2.log" ;;
eager)
    # the ops' eager autograd path (kdagen.ops.EAGER): the API GPU tests through it (bundle
    # api: numerics, no host sync, torch.compile, CUDA-graph capture, bitwise repeats), the
    # host time per layer with it and without it (KDAGEN_EAGER_AUTOGRAD=0), then the default
    # at B1_T8k_H16 (kdagen only) with it (off by default until this call has run)
    export KDAGEN_EAGER_AUTOGRAD=1
    KDAGEN_BUNDLE=.bundles/api timeout 200 python3 -m pytest -q -n 0 tests/test_api_gpu.py \
        > "$OUT/api_gpu.log" 2>&1; echo "api_gpu rc=$?"; tail -5 "$OUT/api_gpu.log"
    for e in 1 0; do
        KDAGEN_EAGER_AUTOGRAD=$e layers "layers3_e$e" 60 "gdn fwdbwd" "kda fwdbwd"
    done
    timeout 150 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --ops gdn,kda \
        --modes fwd,fwdbwd --configs B1_T8k_H16 --no-fla --rep-ms 100 --json "$OUT/eager.json" \
        > "$OUT/eager.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/eager.log" ;;
kdaw2)
    # (prepared, not run) KDA's forward kernels on two warpgroups after the split gate cumsum
    # (each column in two row segments: the busiest thread's instructions 3529 -> 3019 in the
    # output kernel): the GPU check of kda_* on two warpgroups (check_w2k: python -m
    # tools.check_bundle .bundles/check_w2k --set native --pipeline chip --chips sm_90a --only
    # kda_ --lower register_tiles=true --lower register_tile_warpgroups=2), then the A/B at
    # B1_T32k_H16 of the default (def) against KDA's output kernel on them (kout: --ops kda
    # --set tune=kda_fwd.k2_scan2:W) and both forward kernels at one CTA per SM (kboth:
    # --set tune=kda_fwd.k2_scan2:W,kda_fwd.k0_scan0:W+register_tile_ctas_per_sm=1)
    checks 200 check_w2k
    timeout 300 python3 -m kdagen.cli bench --bundle def=.bundles/bench_def --bundle kout=.bundles/ab_kout \
        --bundle kboth=.bundles/ab_kboth --ops kda --modes fwd --configs B1_T32k_H16,B1_T8k_H16 \
        --no-fla --rep-ms 200 --kernels --kernel-reps 3 --json "$OUT/kdaw2.json" > "$OUT/kdaw2.log" 2>&1
    echo "bench_rc=$?"; grep -A4 "^op |" "$OUT/kdaw2.log"; grep -E "k[0-9]_scan[0-9] " "$OUT/kdaw2.log" ;;
esac
