#!/usr/bin/env bash
# GPU calls prepared at stop 59 for the next session (through bench/gpu_run.sh; carry
# [".whl", ".gpucarry"]). Bundles, built here: bench_nm, ab_dq2, ab_c2 (bench/calls/
# stop59_build.sh v2) and bench_sass (python bench/emit_bench_bundle.py .bundles/bench_sass
# --path native --configs B1_T8k_H16 --ops gdn: manifests with each kernel's SASS count).
#   sass    the per-kernel table with the SASS and ns/SASS columns (not yet run on a GPU),
#           gdn fwd and fwd+bwd at B1_T32k_H16
#   beside  why a chunk kernel slows beside its scan (the register-tile dq kernel: 1557 us
#           alone, 3410 beside the reverse scan; the two-chunk prologues): the call timelines
#           of nm, dq2 and c2 with the scans beside (default), beside at default stream
#           priority (KDAGEN_SIDE_PRIORITY=default), and after (KDAGEN_OVERLAP=0)
#   tf32    gdn_bwd's dk kernel with its plain products in TF32 (stop60_build.sh tf32): the
#           full GPU check of gdn_* (check_tf32dk), then gdn fwd+bwd at B1_T32k_H16 against
#           today's default (bench_nm) with the per-kernel table
#   f16c    fp16 checkpoints (stop60_build.sh f16c): the full GPU check of every program
#           (check_f16c), then kdagen today (def60) against fp16 checkpoints (f16c), gdn and kda,
#           fwd and fwd+bwd, B1_T32k_H16 and B8_T4k_H32, with the per-kernel table
#   clocks  the SM clock and power while fwd+bwd calls repeat (gdn B1_T32k_H16, today's
#           default), scans beside their chunk kernels and after them: whether the pairs
#           throttle the GPU (a chunk kernel slows beside its scan more than the scan's 16 SMs
#           explain: the dq kernel 2148 -> 2707 us, the register-tile one 1557 -> 3433)
#   ncu     warp-stall sources (Nsight Compute, one kernel each, B1_T8k_H16): gdn_fwd's state
#           scan with fp32 and with fp16 checkpoints (what a step waits on: the ring's TMA or
#           its products), and the register-tile dq kernel (ab_dq2) alone; read here with
#           python -m tools.ncu_hotspots FILE.csv
#   ff1     one release fence per chunk flag (stop60_build.sh ff1): the full GPU check of every
#           program (check_ff1), today's default (def60) against ff1 and ff1 + fp16 checkpoints
#           (f16ff), gdn and kda, fwd and fwd+bwd, B1_T32k_H16 and B8_T4k_H32; gdn's timeline
set -x
source bench/calls/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
case "$1" in
sass)
    timeout 150 python3 -m kdagen.cli bench --bundle sass=.bundles/bench_sass --bundle nm=.bundles/bench_nm \
        --ops gdn --modes fwd,fwdbwd --configs B1_T32k_H16 --no-fla --rep-ms 150 --kernels \
        --kernel-reps 3 --json "$OUT/ab_sass.json" > "$OUT/ab_sass.log" 2>&1
    echo "bench_rc=$?"; grep -A4 "^op |" "$OUT/ab_sass.log"
    grep -E "^impl|kdagen_sass|Error|Traceback" "$OUT/ab_sass.log" | head -30 ;;
beside)
    for env in "KDAGEN_OVERLAP=1" "KDAGEN_SIDE_PRIORITY=default" "KDAGEN_OVERLAP=0"; do
        tag=${env//=/_}
        env $env timeout 150 python3 bench/overlap_timeline.py --bundle nm=.bundles/bench_nm \
            --bundle dq2=.bundles/ab_dq2 --bundle c2=.bundles/ab_c2 --ops gdn --modes fwdbwd \
            --configs B1_T32k_H16 --reps 5 --json "$OUT/timeline_$tag.json" > "$OUT/timeline_$tag.log" 2>&1
        echo "$env rc=$?"; cat "$OUT/timeline_$tag.log"
    done ;;
f16c)
    full_checks 300 check_f16c
    ab ab_f16c 200 150 def60=.bundles/bench_def60 f16c=.bundles/ab_f16c ;;
ff1)
    full_checks 250 check_ff1
    ab ab_ff1 230 120 def60=.bundles/bench_def60 ff1=.bundles/ab_ff1 f16ff=.bundles/ab_f16ff
    timeout 60 python3 bench/overlap_timeline.py --bundle def60=.bundles/bench_def60 --bundle ff1=.bundles/ab_ff1 \
        --ops gdn --modes fwdbwd --configs B1_T32k_H16 --reps 5 > "$OUT/timeline_ff1.log" 2>&1
    cat "$OUT/timeline_ff1.log" ;;
ncu)
    NCU="ncu --clock-control none -c 1 --section WarpStateStats --section SourceCounters --page source --print-source sass --csv"
    for b in def60 f16c; do
        bundle=.bundles/bench_def60; [ $b = f16c ] && bundle=.bundles/ab_f16c
        timeout 120 $NCU -k regex:k1_scan1 python3 bench/one_call.py $bundle --op gdn --config B1_T8k_H16 --calls 1 \
            > "$OUT/ncu_gdn_fwd_scan_$b.csv" 2> "$OUT/ncu_gdn_fwd_scan_$b.err"
        echo "$b rc=$?"; tail -2 "$OUT/ncu_gdn_fwd_scan_$b.err"
    done
    timeout 150 $NCU -k regex:k2_scan2 --launch-skip 1 python3 bench/one_call.py .bundles/ab_dq2 --op gdn \
        --config B1_T8k_H16 --grad --calls 1 > "$OUT/ncu_gdn_dq2.csv" 2> "$OUT/ncu_gdn_dq2.err"
    echo "dq2 rc=$?"; tail -2 "$OUT/ncu_gdn_dq2.err"
    xz -9 "$OUT"/ncu_*.csv; ls -la "$OUT" ;;
clocks)
    for env in "KDAGEN_OVERLAP=1" "KDAGEN_OVERLAP=0"; do
        tag=${env//=/_}
        nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
            --format=csv,noheader,nounits -lms 20 > "$OUT/clocks_$tag.csv" 2>&1 &
        smi=$!
        env $env timeout 150 python3 bench/overlap_timeline.py --bundle def60=.bundles/bench_def60 \
            --bundle dq2=.bundles/ab_dq2 --ops gdn --modes fwdbwd --configs B1_T32k_H16 --reps 400 \
            > "$OUT/clocks_timeline_$tag.log" 2>&1
        echo "$env rc=$?"; kill $smi; sleep 0.2
        python3 - "$OUT/clocks_$tag.csv" <<'PY'
import sys, statistics
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") >= 4]
busy = [r for r in rows if float(r[2]) > 150]            # samples while the kernels ran
for i, name in ((0, "sm MHz"), (1, "mem MHz"), (2, "power W"), (3, "temp C")):
    vals = [float(r[i]) for r in busy]
    if vals:
        print(f"{name}: median {statistics.median(vals):.0f} min {min(vals):.0f} max {max(vals):.0f} ({len(vals)} samples)")
print("throttle reasons seen:", sorted({r[4].strip() for r in busy}))
PY
        cat "$OUT/clocks_timeline_$tag.log"
    done ;;
tf32)
    full_checks 200 check_tf32dk || exit 0
    timeout 200 python3 -m kdagen.cli bench --bundle nm=.bundles/bench_nm --bundle tf32dk=.bundles/ab_tf32dk \
        --ops gdn --modes fwdbwd --configs B1_T32k_H16,B1_T8k_H16 --no-fla --rep-ms 200 --kernels \
        --kernel-reps 3 --json "$OUT/ab_tf32dk.json" > "$OUT/ab_tf32dk.log" 2>&1
    echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/ab_tf32dk.log"
    grep -E "k4_scan4|Error|Traceback" "$OUT/ab_tf32dk.log" | head -20 ;;
esac
