"""Emit (on a machine with MLIR) the kernel bundle bench_fla.py needs on the GPU machine.

    python bench/emit_bench_bundle.py OUT [--chip sm_90a] [--lower fma|auto|tf32|bf16x3] [--pipeline stable|chip]

It runs the benchmark's calls on tiny CPU inputs under kdagen's recording executor to learn
which (program, options) variants they use, then lowers each with the requested lowering (by
default the chip's full pass pipeline — partitioned into chunk-parallel and state kernels — and
tensor-core matrix products: TF32, bf16x3 for the adjoint decay products) under the variant name the runtime looks up.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from unittest import mock




def bench_variants(ops: list[str], configs: list[str] | None = None,
                   head_dim: int = 128) -> list[tuple[str, dict]]:
    import torch

    from kdagen import benchmark as bench_fla
    from kdagen.runtime.backends import recording

    with recording("cpu") as rec, mock.patch.dict(os.environ):   # the environment restored after
        for family in ops:
            fn = bench_fla.implementations(family, fla=False)["kdagen"]
            for name, (B, T, H, HV, lengths) in bench_fla.CONFIGS.items():
                if configs and name not in configs:
                    continue
                small = [min(n, 70) for n in lengths] if lengths else None
                x, kw, _ = bench_fla.make_inputs(family, 1 if small else B, 70, H, HV, small, "cpu",
                                                 head_dim=head_dim)
                with torch.no_grad():                 # the forward-only timing
                    bench_fla.call(fn, family, x, kw, grad=False)
                # training, with the residual pair (the default) and without
                # (KDAGEN_SAVE_RESIDUALS=0, for the ablation)
                for flag in ("1", "0"):
                    os.environ["KDAGEN_SAVE_RESIDUALS"] = flag
                    with torch.enable_grad():
                        bench_fla.call(fn, family, x, kw, grad=True)
    return rec.variants()


def main(argv=None) -> int:
    from kdagen.driver import pipeline_argument
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--chip", default="sm_90a")
    ap.add_argument("--ops", default="kda,gdn")
    ap.add_argument("--lower", default="auto", choices=["fma", "auto", "tf32", "bf16x3", "bf16"])
    ap.add_argument("--pipeline", default="chip", type=pipeline_argument,
                    help="stable, chip, or chip+PASS{KEY=VALUE} (a pass option's ablation)")
    ap.add_argument("--path", default="portable", choices=["portable", "native"],
                    help="native: the chip's own path (sm_90a: TMA + wgmma + warp specialisation)")
    ap.add_argument("--scan-warpgroups", type=int, default=None,
                    help="consumer warpgroups per CTA of the register-resident scans (ablation)")
    ap.add_argument("--no-register-scan", action="store_true",
                    help="serial scans take the tile lowering of the native path (ablation)")
    ap.add_argument("--chunk-warpgroups", type=int, default=None,
                    help="consumer warpgroups of the native chunk-parallel kernels (ablation)")
    ap.add_argument("--tril-inv", default=None, choices=["blocked", "blocked-fma", "columns"],
                    help="the unit-lower inverse's lowering (ablation)")
    ap.add_argument("--load-batch", type=int, default=None,
                    help="loads a thread issues together in the tile loops (ablation)")
    ap.add_argument("--remat-ops", type=int, default=None,
                    help="re-evaluate scratch-bound tile values of at most this many "
                         "instructions at each consumer (0: always materialise; ablation)")
    ap.add_argument("--scan-k-split", type=int, default=None,
                    help="warpgroups sharing a register scan's value block (K split; ablation)")
    ap.add_argument("--chunk-size", type=int, default=None,
                    help="kdagen's chunk size for the recorded calls (ablation; time them with "
                         "kdagen bench --chunk-size LABEL=C)")
    ap.add_argument("--smem-reserve", type=int, default=None,
                    help="bytes of the shared memory per block kept free (ablation: a smaller "
                         "budget per CTA)")
    ap.add_argument("--smem-row-pad", type=int, default=None,
                    help="elements padding each row of a shared-memory tile buffer (ablation; "
                         "tools/smem_banks.py counts its bank conflicts)")
    ap.add_argument("--chunk-schedule", default=None, choices=["memory", "program"],
                    help="order of the chunk-parallel kernels' steps (ablation: 'program' keeps "
                         "the IR order)")
    ap.add_argument("--no-in-place", action="store_true",
                    help="element-wise results never share their operands' tile buffers "
                         "(ablation of LowerOptions.in_place)")
    ap.add_argument("--eager-sums", choices=["on", "off"], default=None,
                    help="sums of matrix products materialised where made, in spilling kernels "
                         "(LowerOptions.eager_sums)")
    ap.add_argument("--staging-buffers", default=None, choices=["1", "2", "auto"],
                    help="sets of wgmma staging tiles a product's K slices alternate between "
                         "(LowerOptions.staging_buffers)")
    ap.add_argument("--tensormap-params", default=None, choices=["global", "grid_constant"],
                    help="how TMA kernels receive tensor maps (LowerOptions.tensormap_params)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any LowerOptions field (repeatable), e.g. --set chunk_ctas_per_sm=2; "
                         "parsed as `kdagen emit --lower` parses it")
    ap.add_argument("--programs", default=None,
                    help="only these programs (comma-separated, e.g. kda_fwd)")
    ap.add_argument("--configs", default=None,
                    help="only the variants of these benchmark configs (comma-separated)")
    ap.add_argument("--head-dim", type=int, default=128,
                    help="K = V of the recorded calls (kdagen bench --head-dim)")
    args = ap.parse_args(argv)
    from kdagen.codegen.lower.options import parse_lower_option
    try:
        extra = dict(parse_lower_option(text) for text in args.set)
    except ValueError as e:
        ap.error(f"--set: {e}")
    from kdagen.bundle_writer import write_bundle
    from kdagen.runtime.bundle import variant_name
    if args.chunk_size is not None:
        from kdagen import ops
        ops.CHUNK_SIZE = args.chunk_size
    variants = bench_variants(args.ops.split(","),
                              args.configs.split(",") if args.configs else None, args.head_dim)
    if args.programs:
        variants = [v for v in variants if v[0] in args.programs.split(",")]
    for program, options in variants:
        start = time.time()
        lower = {"pipeline": args.pipeline} | ({"dot": args.lower} if args.lower != "fma" else {})
        if args.path != "portable":
            lower["path"] = args.path
        if args.scan_warpgroups is not None:
            lower["scan_warpgroups"] = args.scan_warpgroups
        if args.scan_k_split is not None:
            lower["scan_k_split"] = args.scan_k_split
        if args.chunk_warpgroups is not None:
            lower["chunk_warpgroups"] = args.chunk_warpgroups
        if args.load_batch is not None:
            lower["load_batch"] = args.load_batch
        if args.remat_ops is not None:
            lower["remat_ops"] = args.remat_ops
        if args.tril_inv is not None:
            lower["tril_inv"] = args.tril_inv
        if args.smem_reserve is not None:
            lower["smem_reserve"] = args.smem_reserve
        if args.smem_row_pad is not None:
            lower["smem_row_pad"] = args.smem_row_pad
        if args.chunk_schedule is not None:
            lower["chunk_schedule"] = args.chunk_schedule
        if args.no_register_scan:
            lower["register_scan"] = False
        if args.no_in_place:
            lower["in_place"] = False
        if args.eager_sums is not None:
            lower["eager_sums"] = args.eager_sums == "on"
        if args.tensormap_params is not None:
            lower["tensormap_params"] = args.tensormap_params
        if args.staging_buffers is not None:
            sb = args.staging_buffers
            lower["staging_buffers"] = int(sb) if sb.isdigit() else sb
        lower.update(extra)
        write_bundle(args.out, [(program, options, lower, variant_name(program, options))],
                     [args.chip])
        print(f"{program} {options} ({time.time() - start:.1f} s)", flush=True)
    print(f"wrote {len(variants)} variants to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
