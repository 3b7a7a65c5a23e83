#!/usr/bin/env bash
# One GPU call (stop 50): stop 49's A/B candidates (bench/calls/ab_stop49.sh), then kdagen's
# default bundle against FLA in one process at B1_T8k_H16 (kda). Carry [".whl", ".gpucarry"]
# after `bash bench/prepare_carry.sh wheels bench ab_stop49`; outputs in $OUT.
bash bench/calls/ab_stop49.sh
KDAGEN_BUNDLE=.bundles/bench timeout 200 python3 -m kdagen.cli bench --configs B1_T8k_H16 \
    --ops kda --kernels --json "$OUT/fla.json" > "$OUT/fla.log" 2>&1
head -12 "$OUT/fla.log"
