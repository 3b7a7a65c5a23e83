#!/usr/bin/env bash
# One GPU call (stop 50): stop 49's option candidates and two pipeline candidates against the
# default, KDA B1_T8k_H16, one process, per-kernel table, no FLA. Prepare with
#   bash bench/prepare_carry.sh wheels bench ab_stop49 ab_stop50
# and run through bench/gpu_run.sh with carry [".whl", ".gpucarry"]. Output in $OUT.
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 540 python3 -m kdagen.cli bench --bundle base=.bundles/bench \
    --bundle vl_dst=.bundles/ab_vectorloopsdst --bundle vl_off=.bundles/ab_vectorloopsoff \
    --bundle scan_ops2=.bundles/ab_scanoperandreads2 --bundle eager=.bundles/ab_eagersumstrue \
    --bundle cw4=.bundles/ab_chunkwarpgroups4 --bundle hoist=.bundles/ab_hoist \
    --bundle oc=.bundles/ab_oc \
    --configs B1_T8k_H16 --ops kda --kernels --no-fla --json "$OUT/ab_stop50.json" \
    > "$OUT/ab_stop50.log" 2>&1
head -14 "$OUT/ab_stop50.log" | tail -5
