#!/usr/bin/env bash
# One GPU call (stop 51): run-to-run bits of the kernels in order, and of the overlapped scans
# against them (bench/overlap_determinism.py), KDA then GDN at B1_T8k_H16. Prepare with
#   bash bench/prepare_carry.sh bench
nvidia-smi --query-gpu=name --format=csv,noheader
KDAGEN_BUNDLE=.bundles/bench timeout 150 python3 bench/overlap_determinism.py --ops kda,gdn \
    > "$OUT/overlap_determinism.log" 2>&1
echo "determinism_rc=$?"; cat "$OUT/overlap_determinism.log" | tail -12
