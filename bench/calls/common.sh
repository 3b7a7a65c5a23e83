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
