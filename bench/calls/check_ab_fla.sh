#!/usr/bin/env bash
# One GPU call (stop 49): the GPU check of .bundles/check, a kernel A/B of the bundles named in
# AB (default: base=.bundles/bench and new=.bundles/ab_new) at B1_T8k_H16, then kdagen from
# $NEW_BUNDLE against FLA in one process. Run through bench/gpu_run.sh with carry
# [".whl", ".gpucarry"] after `bash bench/prepare_carry.sh wheels bench check` and
# `python bench/emit_bench_bundle.py .bundles/ab_new --path native --configs B1_T8k_H16 --ops kda`
# (packed into .gpucarry/ab_new.tar.xz). Outputs land in $OUT.
set -x
AB=${AB:-"--bundle base=.bundles/bench --bundle new=.bundles/ab_new"}
NEW_BUNDLE=${NEW_BUNDLE:-.bundles/ab_new}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m tools.gpu_check .bundles/check > "$OUT/check.log" 2>&1
echo "check_rc=$?"; grep -i "fail\|error" "$OUT/check.log" | head -20
timeout 130 python3 -m kdagen.cli bench $AB --configs B1_T8k_H16 --ops kda --kernels --no-fla \
    --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
head -12 "$OUT/ab.log" | tail -5
KDAGEN_BUNDLE=$NEW_BUNDLE timeout 280 python3 -m kdagen.cli bench --configs B1_T8k_H16 --ops kda \
    --kernels --json "$OUT/fla.json" > "$OUT/fla.log" 2>&1
tail -30 "$OUT/fla.log"
