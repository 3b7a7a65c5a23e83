#!/usr/bin/env bash
# One GPU call (stop 50): ncu source counters of the backward's dq and dk kernels
# (bench/calls/ncu_source_bwd.sh) at the default lowering, then kdagen against FLA in one
# process at B1_T8k_H16 (kda). Carry [".whl", ".gpucarry"] after
# `bash bench/prepare_carry.sh wheels bench`; outputs in $OUT.
bash bench/calls/ncu_source_bwd.sh
KDAGEN_BUNDLE=.bundles/bench timeout 330 python3 -m kdagen.cli bench --configs B1_T8k_H16 \
    --ops kda --kernels --json "$OUT/fla.json" > "$OUT/fla.log" 2>&1
head -8 "$OUT/fla.log" | tail -4
