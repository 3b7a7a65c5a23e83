#!/usr/bin/env bash
# Helpers the GPU-call scripts of bench/calls/ source (bash bench/calls/stopNN.sh MODE).

checks() {       # checks TIMEOUT BUNDLE...: the quick GPU check of each bundle, into $OUT
    local t=$1; shift
    for b in "$@"; do
        timeout "$t" python3 -m tools.gpu_check .bundles/$b --quick > "$OUT/$b.log" 2>&1
        echo "$b rc=$?"; grep -E "SUMMARY|FAIL|ERROR|Error" "$OUT/$b.log" | head -24
    done
}
