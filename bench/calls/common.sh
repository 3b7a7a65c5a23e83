#!/usr/bin/env bash
# Helpers the GPU-call scripts of bench/calls/ source (bash bench/calls/stopNN.sh MODE).

checks() {       # checks TIMEOUT BUNDLE...: the quick GPU check of each bundle, into $OUT
    local t=$1; shift
    for b in "$@"; do
        timeout "$t" python3 -m tools.gpu_check .bundles/$b --quick > "$OUT/$b.log" 2>&1
        echo "$b rc=$?"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/$b.log" | head -24
    done
}

full_checks() {  # full_checks TIMEOUT BUNDLE...: the full GPU check of each bundle, into
                 # $OUT/BUNDLE_full.log; fails (status 1) if any check did
    local t=$1 status=0 rc; shift
    for b in "$@"; do
        timeout "$t" python3 -m tools.gpu_check .bundles/$b > "$OUT/${b}_full.log" 2>&1
        rc=$?; echo "$b rc=$rc"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/${b}_full.log" | head -12
        [ $rc = 0 ] || status=1
    done
    return $status
}

layers() {       # layers TAG CALLS "OP MODE"...: bench/host_layers.py on .bundles/bench_def per
                 # case, into $OUT/TAG_OP_MODE.{json,log} (an env prefix reaches its runs)
    local tag=$1 calls=$2; shift 2
    for case in "$@"; do
        set -- $case
        timeout 100 python3 bench/host_layers.py --bundle .bundles/bench_def --op $1 --mode $2 \
            --calls "$calls" --json "$OUT/${tag}_$1_$2.json" > "$OUT/${tag}_$1_$2.log" 2>&1
        echo "$tag $1 $2 rc=$?"; cat "$OUT/${tag}_$1_$2.log"
    done
}

ab() {           # ab TAG TIMEOUT REP_MS NAME=BUNDLE...: kdagen bench of the bundles side by side
                 # (gdn and kda, fwd and fwd+bwd, B1_T32k_H16 and B8_T4k_H32, the per-kernel
                 # table), into $OUT/TAG.{json,log}; prints its table and any error
    local tag=$1 t=$2 rep=$3 bundles=() b; shift 3
    for b in "$@"; do bundles+=(--bundle "$b"); done
    timeout "$t" python3 -m kdagen.cli bench "${bundles[@]}" --ops gdn,kda --modes fwd,fwdbwd \
        --configs B1_T32k_H16,B8_T4k_H32 --no-fla --rep-ms "$rep" --kernels --kernel-reps 3 \
        --json "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1
    echo "bench_rc=$?"; grep -A10 "^op |" "$OUT/$tag.log"
    grep -E "Error|Traceback" "$OUT/$tag.log" | head -20
}
