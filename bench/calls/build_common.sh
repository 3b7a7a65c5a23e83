#!/usr/bin/env bash
# Helpers the bundle-building scripts of bench/calls/ source (bash bench/calls/stopNN_build.sh):
# run from the repository root with PY set to the Python with the compiler.

check() {    # check NAME ONLY [--lower K=V ...]: the GPU check's native set (gdn_*, *_bwd ...)
    local name=$1 only=$2; shift 2
    rm -rf ".bundles/$name"
    "$PY" -m tools.check_bundle ".bundles/$name" --set native --pipeline chip --chips sm_90a \
        --only "$only" "$@" > "/tmp/$name.log" 2>&1
}

bench() {    # bench NAME [emit_bench_bundle options ...]: a kdagen bench bundle (B1_T8k_H16,
             # valid at every config of its head dims)
    local name=$1; shift
    rm -rf ".bundles/$name"
    "$PY" bench/emit_bench_bundle.py ".bundles/$name" --path native --configs B1_T8k_H16 "$@" \
        > "/tmp/$name.log" 2>&1
}

pack() {     # pack NAME...: each bundle xz-compressed into .gpucarry/ (what a GPU call carries)
    for b in "$@"; do tar -cJf ".gpucarry/$b.tar.xz" -C .bundles "$b"; done
    du -sh .gpucarry
}
