#!/usr/bin/env bash
# GPU call (stop 53): intra-card context parallelism (kdagen.runtime.segments). Part "tests":
# its GPU tests and the API's (the ops' residual list changed). Part "bench": the default
# lowering with segments (KDAGEN_SEGMENTS=auto, the cost rule) against itself without
# (nocp: off) and FLA at B1_T32k_H4, then kdagen only at B1_T32k_H2 and B1_T32k_H8.
# Prepare with  bash bench/prepare_carry.sh wheels segments bench api ; carry [".whl", ".gpucarry"].
set -x
part=${1:-tests}
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$part" = tests ]; then
    KDAGEN_BUNDLE=.bundles/segments timeout 200 python3 -m pytest -q -s -n 0 -p no:cacheprovider \
        tests/test_segments_gpu.py > "$OUT/test_segments_gpu.log" 2>&1
    echo "segments_rc=$?"; grep -E "segmented|passed|failed|Error" "$OUT/test_segments_gpu.log" | tail -40
    KDAGEN_BUNDLE=.bundles/api timeout 200 python3 -m pytest -q -p no:cacheprovider \
        tests/test_api_gpu.py > "$OUT/test_api_gpu.log" 2>&1
    echo "api_rc=$?"; tail -3 "$OUT/test_api_gpu.log"
    exit 0
fi
timeout 300 python3 -m kdagen.cli bench --bundle cp=.bundles/bench --bundle nocp=.bundles/bench \
    --bundle side=.bundles/bench --segments side=beside \
    --segments nocp=off --configs B1_T32k_H4 --kernels --json "$OUT/segments_h4.json" \
    > "$OUT/segments_h4.log" 2>&1
echo "bench_h4_rc=$?"; grep -A6 "^op |" "$OUT/segments_h4.log"
timeout 150 python3 -m kdagen.cli bench --bundle cp=.bundles/bench --bundle nocp=.bundles/bench \
    --bundle side=.bundles/bench --segments side=beside \
    --segments nocp=off --configs B1_T32k_H2,B1_T32k_H8 --no-fla --json "$OUT/segments_h2h8.json" \
    > "$OUT/segments_h2h8.log" 2>&1
echo "bench_h2h8_rc=$?"; grep -A10 "^op |" "$OUT/segments_h2h8.log"
