#!/usr/bin/env bash
# One GPU call: Nsight Compute source counters (per SASS instruction: executions, warp-stall
# samples, shared-memory wavefronts and bank conflicts, global sectors) of the KDA backward's
# dq kernel (k2) and dk kernel (k4) at B1_T8k_H16, for the default bundle. Carry
# [".whl", ".gpucarry"] after `bash bench/prepare_carry.sh wheels bench`; read the CSVs with
# python -m tools.ncu_hotspots (stalls; --memory: bank conflicts, global sectors). Outputs in $OUT.
set -x
for spec in "k2_scan2 1" "k4_scan4 0"; do set -- $spec; k=$1
  timeout 240 ncu --clock-control none -k "regex:${k}" --launch-skip $2 -c 1 --section WarpStateStats \
      --section SourceCounters --page source --print-source sass --csv \
      python3 bench/one_call.py .bundles/bench --grad --calls 1 > "/tmp/ncu_${k}.csv" 2> "$OUT/ncu_${k}.err"
  echo "rc=$?"; xz -9 -c "/tmp/ncu_${k}.csv" > "$OUT/ncu_src_${k}.csv.xz"; ls -la "$OUT"
done
head -c 3000 /tmp/ncu_k2_scan2.csv | head -5
