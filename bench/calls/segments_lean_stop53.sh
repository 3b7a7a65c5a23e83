#!/usr/bin/env bash
# GPU call (stop 53, little device time left): the segments GPU tests, then the default with
# segments (cp: the cost rule) against itself without (nocp) and with the chaining runs beside
# their chunk kernels (side: KDAGEN_SEGMENTS=beside) at B1_T32k_H4 and H2, kdagen only
# (-n 0: the errors per tensor print; the image runs pytest with xdist otherwise).
# Prepare with  bash bench/prepare_carry.sh wheels segments bench ; carry [".whl", ".gpucarry"].
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
KDAGEN_BUNDLE=.bundles/segments timeout 150 python3 -m pytest -q -s -n 0 -p no:cacheprovider \
    tests/test_segments_gpu.py > "$OUT/test_segments_gpu.log" 2>&1
echo "segments_rc=$?"; grep -E "segmented|passed|failed|Error|assert" "$OUT/test_segments_gpu.log" | tail -30
timeout 160 python3 -m kdagen.cli bench --bundle cp=.bundles/bench --bundle nocp=.bundles/bench \
    --bundle side=.bundles/bench --segments side=beside \
    --segments nocp=off --configs B1_T32k_H4,B1_T32k_H2 --no-fla --rep-ms 150 --json "$OUT/segments_h4.json" \
    > "$OUT/segments_h4.log" 2>&1
echo "bench_rc=$?"; grep -A6 "^op |" "$OUT/segments_h4.log"; tail -3 "$OUT/segments_h4.log"
