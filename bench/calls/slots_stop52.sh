#!/usr/bin/env bash
# GPU call (prepared at stop 52, not yet run): the GPU check of each candidate, then the default
# lowering (chunk_flags=all) against the candidates and FLA in one process, with per-kernel
# tables: slots (one-stage scan rings with a barrier pair per slot, every slot acquired at the
# step start), slotsp (the later products' slots acquired mid-step), opreads
# (scan_operand_reads=1: the dk kernel's cumsum operand materialised), fresh
# (wgmma_fresh_acc=true: the chunk kernels' wgmma chains start with scale-d 0). Part
# "checks": the GPU checks (one call); part 1: B1_T8k_H16 and B1_T32k_H4 (few heads: the scans
# pace the call); part 2: the other few-head configs and B1_T32k_H16.
# Prepare with  bash bench/prepare_carry.sh wheels bench ab_slots ; carry [".whl", ".gpucarry"].
set -x
part=${1:-1}
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$part" = checks ]; then
    for c in check_slots check_slotsp check_opreads check_fresh; do
        timeout 140 python3 -m tools.gpu_check .bundles/$c > "$OUT/$c.log" 2>&1
        echo "${c}_rc=$?"; tail -1 "$OUT/$c.log"
    done
    exit 0
elif [ "$part" = 1 ]; then
    configs=B1_T8k_H16,B1_T32k_H4
else
    configs=B1_T32k_H2,B1_T32k_H8,B1_T32k_H16
fi
timeout 420 python3 -m kdagen.cli bench --bundle default=.bundles/bench --bundle slots=.bundles/ab_slots \
    --bundle slotsp=.bundles/ab_slotsp --bundle opreads=.bundles/ab_opreads \
    --bundle fresh=.bundles/ab_fresh \
    --configs "$configs" --kernels --json "$OUT/slots_$part.json" > "$OUT/slots_$part.log" 2>&1
echo "bench_rc=$?"; grep -A12 "^op |" "$OUT/slots_$part.log"
grep -E "k3_scan3|k4_scan4" "$OUT/slots_$part.log" | grep fwdbwd
