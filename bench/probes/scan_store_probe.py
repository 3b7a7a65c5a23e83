"""Probe (timing only, results wrong): how much of a register scan's chunk step its checkpoint
stores cost. Emits a bench bundle like bench/emit_bench_bundle.py with the register scan's
``kda.store_chunk`` ops dropped: ``--drop carried`` (the state checkpoint S_c) or ``--drop all``
(every per-chunk store). Time it beside the unmodified bundle with the benchmark's --kernels
table and compare the scan's us/step; never use such a bundle for numerics.

    python bench/probes/scan_store_probe.py --drop all .bundles/P2 [emit_bench_bundle args]
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--drop" not in argv:
        raise SystemExit("--drop carried|all is required")
    i = argv.index("--drop")
    drop = argv[i + 1]
    del argv[i:i + 2]
    if drop not in ("carried", "all"):
        raise SystemExit(f"--drop {drop}: carried or all")
    from kdagen.codegen.lower import register_scan as rs

    def flush_early(self):              # the carried value's checkpoints
        self._early = []
    rs.RegisterScanEmitter._flush_early = flush_early
    if drop == "all":
        rs.RegisterScanEmitter._store_chunk = lambda self, n: None
    import emit_bench_bundle
    return emit_bench_bundle.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
