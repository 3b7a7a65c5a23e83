#!/usr/bin/env bash
# One GPU-machine call (kinds nvidia-h200*): install the carried wheels (.whl), unpack the
# carried bundles (.gpucarry/*.tar.xz -> .bundles/), restore a carried Triton cache
# (.gpucarry/tcache.tar.xz: FLA's compiled and autotuned kernels, so its autotuning runs once
# per session, not once per call), then run "$@" and save the Triton cache to $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/tcache TRITON_CACHE_AUTOTUNING=1
mkdir -p .bundles /tmp/tcache
for f in .gpucarry/*.tar.xz; do
    case "$f" in
        *tcache.tar.xz) tar -xJf "$f" -C /tmp ;;
        *) tar -xJf "$f" -C .bundles ;;
    esac
done
bash -c "$*"
rc=$?
tar -cJf "$OUT/tcache.tar.xz" -C /tmp tcache 2>/dev/null
exit $rc
