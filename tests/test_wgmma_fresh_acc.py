"""LowerOptions.wgmma_fresh_acc: the sm_90a chunk kernels start each wgmma chain with scale-d 0
on undefined accumulators, so no zeros are copied into them between the wgmma fence and the
first wgmma (where ptxas inserts a warpgroup.arrive, C7519). Numerics on the GPU
(bench/calls/slots_stop52.sh runs the GPU check with it)."""
from __future__ import annotations

import re
import shutil

import pytest


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
@pytest.mark.parametrize("program", ["kda_fwd", "gdn_bwd"])
def test_fresh_chains_leave_ptxas_no_arrive_to_insert(program):
    from kdagen import driver
    from kdagen.codegen import ptxas
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    mod = driver.build_module(program, {}, pipeline="chip", chip="sm_90a")

    def chunk_kernels(fresh):
        opts = LowerOptions(path="native", dot="auto", wgmma_fresh_acc=fresh)
        # the native path's chunk kernels (wgmma_fresh_acc is theirs; register-tile kernels
        # start their chains their own way)
        return [(k, driver.ptx_of(k.module, t, k.name)) for k in lower_program(mod, t, options=opts)
                if k.path == "sm90-native"]

    # MLIR's wgmma lowering: the scale-d predicate from the immediate (1 accumulates)
    scale_d = re.compile(r"setp\.ne\.b32 p, (\d), 0;\s*wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\.f32\.(?:tf32|bf16)")
    arrives = {}
    for fresh in (False, True):
        logs, firsts = [], 0
        for k, ptx in chunk_kernels(fresh):
            firsts += sum(1 for m in scale_d.finditer(ptx) if m.group(1) == "0")
            if "wgmma.mma_async" in ptx:
                r = ptxas.assemble(ptx, "sm_90a", ptxas.find_ptxas())
                assert r.ok and "0 bytes spill stores" in r.log, r.log
                logs.append(r.log)
        arrives[fresh] = sum(log.count("C7519") for log in logs)
        assert (firsts > 0) == fresh
    assert arrives[False] > 0 and arrives[True] == 0
