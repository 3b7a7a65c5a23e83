#!/usr/bin/env bash
# One GPU call (stop 50): the shared-memory bank-conflict fixes against the default (KDA
# B1_T8k_H16, one process, per-kernel table, no FLA) -- transposed_store_order=stored_vec,
# smem_pad_all=true, both -- then the GPU check of both (native set). Prepare with
#   bash bench/prepare_carry.sh wheels bench ab_banks
# and run through bench/gpu_run.sh with carry [".whl", ".gpucarry"]. Outputs in $OUT.
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 -m kdagen.cli bench --bundle base=.bundles/bench --bundle sv=.bundles/ab_sv \
    --bundle pad=.bundles/ab_pad --bundle svpad=.bundles/ab_svpad --bundle svpad8=.bundles/ab_svpad8 \
    --configs B1_T8k_H16 --ops kda --kernels --no-fla --json "$OUT/ab_banks.json" \
    > "$OUT/ab_banks.log" 2>&1
head -6 "$OUT/ab_banks.log" | tail -3
timeout 200 python3 -m tools.gpu_check .bundles/check_svpad > "$OUT/check_svpad.log" 2>&1
echo "check_rc=$?"; tail -3 "$OUT/check_svpad.log"; grep -ciE "FAIL" "$OUT/check_svpad.log"
