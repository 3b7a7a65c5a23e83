"""The program variants the GPU check covers, written into a bundle (needs the compiler).

``python -m tools.check_bundle OUT [--chips sm_90a,...] [--quick] [--set default|native]``;
then, on the GPU machine, ``python -m tools.gpu_check OUT``.
"""
from __future__ import annotations

from kdagen.bundle_writer import write_bundle
from kdagen.driver import DEFAULT_LOWERING, Compilation, pipeline_argument

# The variants the GPU check covers by default (kda/gdn, fwd/bwd, K = V = 64/128, both gate
# forms, GVA, varlen, fp16, without initial state).
PRODUCTS = DEFAULT_LOWERING["dot"]   # what ships (auto: TF32 products, bf16x3 adjoint decay ones)
TC = {"dot": PRODUCTS}          # tensor cores
PART = {"dot": PRODUCTS, "pipeline": "chip"}   # + the chip's pipeline: partitioned kernels
NATIVE = {"dot": PRODUCTS, "pipeline": "chip", "path": "native"}   # sm_90a: TMA + wgmma + WS
NATIVE_SET = [
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound", gva_ratio=2, varlen=True), NATIVE),
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="softplus"), NATIVE),
    ("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="lower_bound", dtype="fp16",
                     use_initial_state=False), NATIVE),
    ("gdn_fwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus"), NATIVE),
    ("kda_bwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound"), NATIVE),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus", gva_ratio=2, varlen=True), NATIVE),
    ("gdn_bwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus"), NATIVE),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus"), NATIVE),
    # training's pair: the forward saves the residuals, the backward reads them (the GPU check
    # feeds each such backward what its forward wrote on the same inputs)
    *[(f"{family}_{step}", dict(options, save_residuals=True), NATIVE)
      for family, options in (
          ("kda", dict(head_k_dim=128, head_v_dim=128, gate="softplus")),
          ("kda", dict(head_k_dim=64, head_v_dim=64, gate="softplus", gva_ratio=2, varlen=True)),
          ("gdn", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus")))
      for step in ("fwd", "bwd")],
    # decode steps (the per-token programs of kdagen.fused_recurrent_*)
    ("kda_decode", dict(head_k_dim=128, head_v_dim=128, gate="softplus", gva_ratio=2, varlen=True), NATIVE),
    ("gdn_decode", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus"), NATIVE),
    # ... on a state pool (the kernel reads and writes the sequences' slots, in place)
    ("kda_decode", dict(head_k_dim=128, head_v_dim=128, gate="softplus", gva_ratio=2, varlen=True,
                        state_pool=True, slot_dtype="i32"), NATIVE),
    ("gdn_decode", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus", state_pool=True),
     NATIVE),
    # ... split over the value columns (value_split CTAs per sequence and head)
    ("kda_decode", dict(head_k_dim=128, head_v_dim=128, gate="softplus", gva_ratio=2, varlen=True,
                        state_pool=True, value_split=4), NATIVE),
    ("gdn_decode", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus", value_split=2),
     NATIVE),
    # ... on pools stored otherwise: rows in bf16 and/or value-first [slots, HV, V, K]
    ("kda_decode", dict(head_k_dim=128, head_v_dim=128, gate="softplus", gva_ratio=2, varlen=True,
                        state_pool=True, value_split=2, state_dtype="bf16", state_v_first=True),
     NATIVE),
    ("gdn_decode", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus", state_pool=True,
                        value_split=2, state_dtype="bf16"), NATIVE),
    ("kda_decode", dict(head_k_dim=64, head_v_dim=128, gate="softplus", state_pool=True,
                        value_split=4, state_v_first=True), NATIVE),
]

# K = 256 (V = 128: a larger V runs in value parts) on the sm_90a native path, with the
# lowering defaults that keep it free of spills (register_scan.k_split_for, sm90_native.
# chunk_warpgroups, the tuning table)
K256_SET = [
    ("kda_fwd", dict(head_k_dim=256, head_v_dim=128, gate="softplus"), NATIVE),
    ("kda_fwd", dict(head_k_dim=256, head_v_dim=128, gate="lower_bound", gva_ratio=2, varlen=True),
     NATIVE),
    ("kda_bwd", dict(head_k_dim=256, head_v_dim=128, gate="softplus"), NATIVE),
    ("gdn_fwd", dict(head_k_dim=256, head_v_dim=128, gate="gdn_softplus"), NATIVE),
    ("gdn_bwd", dict(head_k_dim=256, head_v_dim=128, gate="gdn_softplus"), NATIVE),
]
# What sm_100a and sm_120a would run, compiled for sm_90a so an H100/H200 checks it
# (kdagen.driver.standin_lowering: the chip's pipeline, the portable path, its shared-memory
# budget); each variant's name ends in "_as_<chip>".
STANDIN_CHIPS = ("sm_100a", "sm_120a")
STANDIN_PROGRAMS = [
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound", gva_ratio=2, varlen=True)),
    ("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus", dtype="fp16",
                     use_initial_state=False)),
    ("gdn_fwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus")),
    ("kda_bwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound")),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus", gva_ratio=2, varlen=True)),
    ("gdn_bwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus")),
    ("gdn_bwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound")),
]


def standin_set(chips=STANDIN_CHIPS) -> list:
    """(program, options, lowering, variant name) of STANDIN_PROGRAMS for each of ``chips``."""
    from kdagen.driver import standin_lowering
    from kdagen.runtime.bundle import variant_name
    items = []
    for chip in chips:
        lower = standin_lowering(chip)
        for program, options in STANDIN_PROGRAMS:
            items.append((program, options, lower,
                          f"{variant_name(program, options, lower)}_as_{chip}"))
    return items


DEFAULT_SET = [
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound", gva_ratio=2, varlen=True), PART),
    ("gdn_fwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus"), PART),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus"), PART),
    ("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus")),
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound"), TC),
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound"), {"dot": "bf16"}),
    ("gdn_fwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound", gva_ratio=2, varlen=True), TC),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="lower_bound", gva_ratio=2, varlen=True), TC),
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound", gva_ratio=2, varlen=True)),
    ("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="lower_bound", dtype="fp16",
                     use_initial_state=False)),
    ("gdn_fwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound", gva_ratio=2, varlen=True)),
    ("gdn_fwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus")),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus", gva_ratio=2, varlen=True)),
    ("gdn_bwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound")),
    ("kda_bwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound")),
    ("kda_decode", dict(head_k_dim=64, head_v_dim=64, gate="lower_bound", gva_ratio=2, varlen=True), PART),
    ("gdn_decode", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound", state_pool=True), PART),
]


def main(argv=None) -> int:
    """``python -m tools.check_bundle OUT [--chips sm_90a,...] [--quick]``: write the
    default variant set (DEFAULT_SET) for the GPU check."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("out")
    ap.add_argument("--chips", default="sm_90a")
    ap.add_argument("--quick", action="store_true", help="forward variants only")
    ap.add_argument("--set", default="default", choices=["default", "native", "standin", "k256"],
                    help="default: the portable variants (DEFAULT_SET); native: the sm_90a "
                         "native-path variants (NATIVE_SET); standin: what sm_100a and "
                         "sm_120a would run, compiled for sm_90a (STANDIN_PROGRAMS; use "
                         "--chips sm_90a); k256: K = 256 on the sm_90a native path (K256_SET)")
    ap.add_argument("--standin-chips", default=",".join(STANDIN_CHIPS),
                    help="the chips --set standin stands in for")
    ap.add_argument("--pipeline", default="stable", type=pipeline_argument,
                    help="stable: kda-stable-reassociate only; chip: the chip's full pipeline "
                         "(partitioned chunk-parallel + state kernels); chip+PASS{KEY=VALUE}: "
                         "the chip's pipeline with that pass option (also for the sets' "
                         "variants that name the chip's pipeline)")
    ap.add_argument("--lower", action="append", default=[], metavar="KEY=VALUE",
                    help="a lowering option (kdagen.codegen.lower.options.LowerOptions) for "
                         "every variant, e.g. chunk_warpgroups=2 or tril_inv=columns; repeatable")
    ap.add_argument("--only", default=None, help="only variants whose program or options "
                                                 "contain this text")
    ap.add_argument("--kernel-dot", default="", metavar="k0=bf16x3,...",
                    help="every product of the named tile kernels (by index, in every variant: "
                         "narrow with --only) at that precision, as tools.sim_check's option")
    args = ap.parse_args(argv)
    from .sim_check import kernel_dots, kernel_threads
    dots = kernel_dots(args.kernel_dot)         # a bad value fails before any variant is built
    if args.set == "standin":
        chosen = standin_set(tuple(args.standin_chips.split(",")))
    else:
        chosen = {"native": NATIVE_SET, "k256": K256_SET}.get(args.set, DEFAULT_SET)
    items = [it for it in chosen if not (args.quick and it[0].endswith("_bwd"))]
    if args.only:
        items = [it for it in items if args.only in f"{it[0]} {it[1]}"]
    if args.pipeline.startswith("chip+"):     # the sets' chip-pipeline variants take it too
        items = [(it[0], it[1], {**it[2], "pipeline": args.pipeline}, *it[3:])
                 if len(it) > 2 and it[2].get("pipeline") == "chip" else it for it in items]
    extra = dict(_lower_option(kv) for kv in args.lower)
    if extra:
        items = [(it[0], it[1], {**(it[2] if len(it) > 2 else {}), **extra}, *it[3:])
                 for it in items]
    built = []
    for it in items:
        try:
            Compilation(it[0], it[1], "sm_90a", pipeline="stable").run("kda-stable-reassociate")
            built.append(it)
        except Exception as exc:  # noqa: BLE001 - e.g. a backward that does not derive yet
            print(f"skipping {it[0]} {it[1]}: {type(exc).__name__}: {exc}")
    with kernel_threads({}, dots):
        res = write_bundle(args.out, built, args.chips.split(","), verbose=True,
                           pipeline=args.pipeline)
    print(f"wrote {len(res['variants'])} variants, {len(res['report'])} kernels to {args.out}")
    return 0


def _lower_option(text: str) -> tuple:
    """KEY=VALUE of a lowering option, VALUE parsed as the option's type."""
    from kdagen.codegen.lower.options import parse_lower_option
    try:
        return parse_lower_option(text)
    except ValueError as err:
        raise SystemExit(f"--lower {text}: {err}") from None


if __name__ == "__main__":
    raise SystemExit(main())
