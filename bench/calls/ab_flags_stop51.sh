#!/usr/bin/env bash
# One GPU call (stop 51): chunk-ready flags (a register scan beside the chunk kernel that
# feeds it, kdagen.codegen.lower.chunk_flags). First the GPU check of the native set with the
# flags on (the default); then KDA and GDN at B1_T8k_H16 and B1_T32k_H16 in one process with
# FLA: bench (flags, the scans overlapped) against ab_noflags (chunk_flags=false); then bench
# again with KDAGEN_OVERLAP=0 (the same kernels, in order on one stream: what the flag code
# itself costs). Prepare with
#   bash bench/prepare_carry.sh wheels bench ab_flags check
# and run through bench/gpu_run.sh with carry [".whl", ".gpucarry"]. Outputs in $OUT.
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m tools.gpu_check .bundles/check > "$OUT/check_flags.log" 2>&1
echo "check_rc=$?"; tail -3 "$OUT/check_flags.log"; grep -ciE "FAIL" "$OUT/check_flags.log"
timeout 420 python3 -m kdagen.cli bench --bundle flags=.bundles/bench \
    --bundle noflags=.bundles/ab_noflags --configs B1_T8k_H16,B1_T32k_H16 --kernels \
    --json "$OUT/ab_flags.json" > "$OUT/ab_flags.log" 2>&1
echo "bench_rc=$?"; head -40 "$OUT/ab_flags.log"
KDAGEN_OVERLAP=0 timeout 200 python3 -m kdagen.cli bench --bundle inorder=.bundles/bench \
    --configs B1_T8k_H16,B1_T32k_H16 --no-fla --json "$OUT/ab_flags_inorder.json" \
    > "$OUT/ab_flags_inorder.log" 2>&1
echo "inorder_rc=$?"; head -20 "$OUT/ab_flags_inorder.log"
