"""kdagen vs FLA (fla-core) on the same inputs in one process (docs/MATH.md §4).

For each config: forward (no grad) and forward+backward, median ms over repeated runs
(triton.testing.do_bench), the ratio FLA time / kdagen time, % of the roofline floor
(max(bytes moved once / 4.25 TB/s, FLOPs / 700 TFLOP/s)), and the first-call time (module load
for kdagen, compilation/autotuning for FLA) measured separately, and each call's host time
(``<impl>_host_ms``, `host_enqueue_ms`: near the median, the call is host-bound). Prints a table
and writes JSON.

With ``--kernels``, also one row per kernel launched by each kdagen call (kdagen/kernel_table.py):
grid, threads, CTAs per SM, registers, shared memory, median µs per call, µs per chunk step of
state scans, bytes moved (the IR's count) and % of the bandwidth floor at 4.8 TB/s. Each launch
is timed with CUDA events recorded on the stream right before and after it
(kdagen.runtime.launch.LaunchRecorder), median over ``--kernel-reps`` calls.

    kdagen bench --json bench.json [--configs B1_T8k_H16,...] [--ops kda,gdn] [--kernels]
    python bench/bench_fla.py ... (the same)

Needs a CUDA GPU, fla-core, and a kdagen kernel bundle (KDAGEN_BUNDLE) or the MLIR package.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

from kdagen import kernel_table

COPY_BYTES_PER_S = 4.25e12
MATMUL_FLOPS_PER_S = 700e12
CHUNK = 64

# name -> (B, T, H, HV, varlen lengths or None)
CONFIGS = {
    "B1_T8k_H16": (1, 8192, 16, 16, None),
    "B1_T32k_H16": (1, 32768, 16, 16, None),
    "B1_T32k_H32": (1, 32768, 32, 32, None),
    "B8_T4k_H32": (8, 4096, 32, 32, None),
    "varlen_mix_H16": (1, None, 16, 16, [1, 17, 64, 129, 1000, 2500, 4096, 8192, 300, 16000]),
    "gva_H4_HV16_T8k": (1, 8192, 4, 16, None),
}
#: few heads, long sequences: the state scans run on B·HV·(V / 64) CTAs, a handful of the 132
#: SMs (what context parallelism is for); asked by name, not in the default set
SMALL_HEAD_CONFIGS = {f"B1_T32k_H{h}": (1, 32768, h, h, None) for h in (2, 4, 8)}
ALL_CONFIGS = {**CONFIGS, **SMALL_HEAD_CONFIGS}


def flops_per_token(K: int, V: int, C: int = CHUNK, backward: bool = False) -> float:
    """Matrix FLOPs of the chunked algorithm per token and value head (forward: Akk, Aqk, the
    inverse, w, u, v', o, state update; the backward counted as 2.5x the forward)."""
    fwd = 2 * (2 * C * K + C * C / 3 + C * (K + V) + K * V + K * V + C * V + K * V)
    return fwd * (3.5 if backward else 1.0)


def bytes_moved(B, T, H, HV, K, V, family, backward, elt=2):
    """Bytes read/written once: q, k (H heads), v, g, beta, o (HV heads); plus do and every
    gradient for forward+backward."""
    g = K if family == "kda" else 1
    tokens = B * T
    fwd = tokens * (H * 2 * K + HV * (V + g + 1 + V)) * elt
    return fwd * (2.2 if backward else 1.0)


#: the head dims the benchmark times (K = V)
HEAD_DIMS = (64, 128, 256)


def make_inputs(family, B, T, H, HV, lengths, device, seed=0, head_dim=128):
    import torch
    K = V = head_dim
    gen = torch.Generator(device=device).manual_seed(seed)
    B = B if lengths is None else 1

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(torch.bfloat16)

    cu = None
    if lengths is not None:
        T = sum(lengths)
        cu = torch.tensor([0] + list(__import__("itertools").accumulate(lengths)),
                          dtype=torch.int32, device=device)
    N = len(lengths) if lengths else B
    gshape = (B, T, HV, K) if family == "kda" else (B, T, HV)
    x = dict(q=rnd(B, T, H, K), k=rnd(B, T, H, K), v=rnd(B, T, HV, V), g=rnd(*gshape),
             beta=rnd(B, T, HV),
             initial_state=torch.randn(N, HV, K, V, generator=gen, device=device) * 0.1)
    kw = dict(use_qk_l2norm_in_kernel=True, output_final_state=True, cu_seqlens=cu)
    if family == "kda":
        kw.update(use_gate_in_kernel=True, A_log=torch.rand(HV, device=device).log1p(),
                  dt_bias=torch.randn(HV * K, device=device) * 0.1, use_beta_sigmoid_in_kernel=True)
    else:
        x["g"] = -torch.nn.functional.softplus(x["g"].float()).to(torch.bfloat16)
        x["beta"] = x["beta"].float().sigmoid().to(torch.bfloat16)
    return x, kw, T


def implementations(family, fla=True, bundles: dict | None = None,
                    chunk_sizes: dict | None = None, segments: dict | None = None):
    """{name: callable}: kdagen (or one ``kdagen_<label>`` per bundle folder of ``bundles``, the
    bundle selected through KDAGEN_BUNDLE at each call, and kdagen's chunk size from
    ``chunk_sizes[label]`` when given: an ablation, the bundle must hold those variants;
    ``segments[label]``: its KDAGEN_SEGMENTS, intra-card context parallelism) and FLA when
    importable."""
    impls = {}
    import kdagen
    fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    if bundles:
        for label, path in bundles.items():
            impls[f"kdagen_{label}"] = _with_bundle(fn, path, (chunk_sizes or {}).get(label),
                                                    (segments or {}).get(label))
    else:
        impls["kdagen"] = fn
    if not fla:
        return impls
    try:
        if family == "kda":
            from fla.ops.kda import chunk_kda as fla_fn
        else:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_fn
        impls["fla"] = fla_fn
    except Exception as err:  # report, don't hide
        print(f"FLA unavailable for {family}: {err!r}", file=sys.stderr)
    if family == "gdn":
        try:        # FlashQLA (TileLang), GDN only; its own defaults (automatic intra-card CP)
            from flash_qla import chunk_gated_delta_rule as flashqla_fn
            _relax_tilelang_init_check()
            impls["flashqla"] = flashqla_fn
        except Exception as err:
            print(f"FlashQLA unavailable: {err!r}", file=sys.stderr)
    return impls


def _relax_tilelang_init_check() -> None:
    """FlashQLA 0.1.3's GDN backward does not compile under TileLang 0.1.15 (the newest with
    wheels for the GPU image): its buffer-initialisation check stops at ``dk_fragment`` ("read
    before anything writes it", H200, stop 37). The check only diagnoses; switch it off on
    FlashQLA's jitted kernels, as the message suggests, so its backward can be timed."""
    import importlib
    import pkgutil

    import flash_qla
    import tilelang

    key = getattr(tilelang.PassConfigKey, "TL_DISABLE_BUFFER_INIT_CHECK", None)
    if key is None:                       # an older TileLang without the check
        return
    for info in pkgutil.walk_packages(flash_qla.__path__, "flash_qla."):
        try:
            mod = importlib.import_module(info.name)
        except Exception:                 # a part for another chip; FlashQLA reports it itself
            continue
        for obj in vars(mod).values():
            configs = getattr(obj, "pass_configs", None)
            if isinstance(configs, dict):
                configs[key] = True
            elif configs is None and type(obj).__name__ == "JITImpl":
                obj.pass_configs = {key: True}


#: the other implementations kdagen is compared with: impl name -> its label in the tables
REFERENCES = {"fla": "FLA", "flashqla": "FlashQLA"}


#: KDAGEN_SEGMENTS when the bench started (its impls set the variable per call)
_SEGMENTS = os.environ.get("KDAGEN_SEGMENTS", "auto")


def _with_bundle(fn, path, chunk_size: int | None = None, segments: str | None = None):
    from kdagen import ops
    size = chunk_size or ops.CHUNK_SIZE           # kdagen's own unless the ablation sets one
    segments = segments or _SEGMENTS       # the setting the bench started with

    def run(*args, **kwargs):
        os.environ["KDAGEN_BUNDLE"] = str(path)
        # set, not restored: the backward of this call runs before another impl's call
        ops.CHUNK_SIZE = size
        os.environ["KDAGEN_SEGMENTS"] = segments
        return fn(*args, **kwargs)
    run.__module__ = fn.__module__
    return run


def call(fn, family, x, kw, grad):
    import torch
    args = {k: (v.detach().requires_grad_(grad) if v.is_floating_point() else v)
            for k, v in x.items()}
    if family != "kda":
        kw = {k: v for k, v in kw.items() if k in ("use_qk_l2norm_in_kernel", "output_final_state",
                                                    "cu_seqlens")}
        if not fn.__module__.startswith("kdagen"):    # FLA's and FlashQLA's GDN take g in fp32
            args["g"] = args["g"].detach().float().requires_grad_(grad)
    else:
        kw = dict(kw)
        if "use_beta_sigmoid_in_kernel" in kw and fn.__module__.startswith("fla"):
            kw.pop("use_beta_sigmoid_in_kernel")
            args["beta"] = args["beta"].float().sigmoid().to(args["beta"].dtype).detach().requires_grad_(grad)
    o, ht = fn(args["q"], args["k"], args["v"], args["g"], args["beta"],
               initial_state=args["initial_state"], **kw)
    if grad:
        torch.autograd.backward([o, ht], [torch.ones_like(o), torch.ones_like(ht)])
    return o


def measure(fn, warmup_ms=50, rep_ms=300):
    import triton
    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def host_enqueue_ms(fn, reps: int = 20, synchronize=None, clock=time.perf_counter) -> float:
    """Median host time of one call of ``fn`` from an idle device until it returns, without
    waiting for its kernels (``synchronize``, torch.cuda.synchronize by default, runs before
    each call and after it, outside the timing; ``clock``: seconds). Where it nears the
    do_bench time, the call is host-bound: the device waits on Python, and end-to-end times
    carry host jitter."""
    import statistics
    if synchronize is None:
        import torch
        synchronize = torch.cuda.synchronize
    times = []
    for _ in range(reps):
        synchronize()
        start = clock()
        fn()
        times.append(clock() - start)
        synchronize()
    return 1e3 * statistics.median(times)


def time_kernel_launches(run, reps: int) -> list[list[tuple]]:
    """Call ``run()`` ``reps`` times with every kernel launch bracketed by CUDA events; per
    call, ``[(kernel name, grid, manifest entry as a dict, µs), ...]`` in launch order.

    The events are recorded on the launch stream right before and after each launch, so a
    launch that finds the GPU idle also counts the few µs the host takes to submit it; the
    bench's kernels run for tens of µs to ms, well above that. The kernels run in order on one
    stream here (no scan beside the chunk kernel that feeds it, kdagen.runtime.launch.OVERLAP):
    each row is that kernel alone; the end-to-end rows time the overlapped call."""
    import torch

    from kdagen.runtime import launch as L
    calls = []
    overlap, L.OVERLAP = L.OVERLAP, False
    try:
        for _ in range(reps):
            with L.LaunchRecorder() as recorder:
                run()
            calls.append(recorder.records)
    finally:
        L.OVERLAP = overlap
    torch.cuda.synchronize()        # elapsed_time needs both events completed
    kernels = {r.name: r.entry for records in calls for r in records}
    entries = {name: asdict(entry) for name, entry in kernels.items()}   # one dict per kernel
    return [[(r.name, r.grid, entries[r.name], r.elapsed_us()) for r in records]
            for records in calls]


def kernel_rows(run, reps: int, context: dict, *, tokens: int, value_heads: int,
                longest_tokens: int, sequences: int | None = None) -> list[dict]:
    """The per-kernel table rows of one kdagen call (``run``), each with ``context`` (impl,
    op, config, mode) in front."""
    import torch
    calls = time_kernel_launches(run, reps)
    sms = (torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
           if torch.cuda.is_available() else None)
    return [{**context, **kernel_table.kernel_row(entry, grid, times, tokens=tokens,
                                                  value_heads=value_heads,
                                                  longest_tokens=longest_tokens, chunk=CHUNK,
                                                  sequences=sequences, sms=sms)}
            for _, grid, entry, times in kernel_table.group_launches(calls)]


def _kernel_rows_of_call(run, grad: bool, reps: int, context: dict, **sizes) -> list[dict]:
    """:func:`kernel_rows` under the grad mode of the timed call; a failure is reported and
    gives no rows (the end-to-end row already measured stands)."""
    import torch
    try:
        with torch.enable_grad() if grad else torch.no_grad():
            return kernel_rows(run, reps, context, **sizes)
    except Exception as err:
        print(f"{' '.join(context.values())}: kernel timing failed: {type(err).__name__}: {err}",
              file=sys.stderr)
        return []


def reference_stack() -> dict:
    """The installed versions of the reference implementations and what picks their paths
    (None: not installed). FLA takes TileLang kernels for some ops when TileLang is
    importable, which changes its times (on the H200, KDA B1_T8k_H16 forward 0.82 ms without
    TileLang, 1.36 ms with it in another process), so every result records it."""
    from importlib import metadata
    out = {}
    for dist in ("fla-core", "flash-qla", "tilelang", "triton", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


#: a call whose host enqueue time is at least this share of its time is host-bound: the device
#: waits on Python, so its time says little about the kernels (kdagen and FLA at B1_T8k_H16)
HOST_BOUND_SHARE = 0.9


def summary_table(rows: list[dict]) -> list[str]:
    """The end-to-end table's lines: one column per implementation any row has (a family's
    references differ: FlashQLA has GDN only), the ratios of each reference to each kdagen
    column, the floor; a time marked * where the call was host-bound (HOST_BOUND_SHARE),
    with a footnote saying so."""
    names = []
    for r in rows:
        for key in r:
            for suffix in ("_ms", "_error"):
                if key.endswith(suffix) and not key.endswith("_host_ms") and key != "floor_ms":
                    n = key[:-len(suffix)]
                    if n not in names:
                        names.append(n)
    kd = [n for n in names if n.startswith("kdagen")]
    refs = [ref for ref in REFERENCES if ref in names]
    header = ["op", "config", "mode", *(f"{n} ms" for n in names),
              *(f"{REFERENCES[ref]}/{n}" for ref in refs for n in kd), "floor ms"]
    lines = [" | ".join(header)]
    marked = False
    for r in rows:
        cells = [r["op"], r["config"], r["mode"]]
        for n in names:
            ms, host = r.get(n + "_ms"), r.get(n + "_host_ms")
            if ms is None:
                cells.append("ERR" if n + "_error" in r else "-")
                continue
            bound = host is not None and host >= HOST_BOUND_SHARE * ms
            marked |= bound
            cells.append(f"{ms:.3f}{'*' if bound else ''}")
        for ref in refs:
            for n in kd:
                key = f"ratio_{ref}_over_{n}"
                cells.append(f"{r[key]:.3f}" if key in r else "-")
        cells.append(f"{r['floor_ms']:.3f}")
        lines.append(" | ".join(cells))
    if marked:
        lines.append(f"* host-bound: the call's host enqueue time is at least "
                     f"{HOST_BOUND_SHARE:.0%} of its time (the device waits on Python); compare "
                     "kernels at a larger config")
    return lines


def _write_json(path, rows, kernels, device_name) -> None:
    from kdagen.runtime import launch
    data = {"rows": rows, "device": device_name, "references": reference_stack(),
            "kdagen_overlap": launch.OVERLAP}
    if kernels is not None:
        data["kernels"] = kernels
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def _config_help() -> str:
    rows = []
    for name, (B, T, H, HV, lengths) in ALL_CONFIGS.items():
        shape = (f"varlen {len(lengths)} sequences, {sum(lengths)} tokens" if lengths
                 else f"B={B} T={T}")
        rows.append(f"{name} ({shape}, H={H}, HV={HV})")
    return "; ".join(rows)


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's arguments (``kdagen bench --help`` prints their help)."""
    parser = argparse.ArgumentParser(
        prog="kdagen bench", description=__doc__.splitlines()[0],
        epilog="Every config uses K = V = --head-dim (128) and bf16 inputs. Each row times "
               "the forward "
               "(fwd, no grad) or forward + backward (fwdbwd) of every implementation: median "
               "ms (triton.testing.do_bench), the first call separately, FLA/kdagen ratios and "
               "% of the roofline floor. The kernel bundle comes from KDAGEN_BUNDLE (or "
               "--bundle), else kdagen compiles the kernels (needs the MLIR package). "
               "--kernels adds a table with one row per kernel of each kdagen call "
               "(CUDA-event times per launch).")
    parser.add_argument("--configs", default=",".join(CONFIGS), metavar="NAME[,NAME...]",
                        help="comma-separated problem sizes to time (default: the first "
                             f"{len(CONFIGS)}): "
                             + _config_help().replace("%", "%%"))
    parser.add_argument("--ops", default="kda,gdn", metavar="OP[,OP...]",
                        help="comma-separated ops: kda (chunk_kda), gdn "
                             "(chunk_gated_delta_rule) (default: %(default)s)")
    parser.add_argument("--modes", default="fwd,fwdbwd", metavar="MODE[,MODE...]",
                        help="comma-separated: fwd (forward, no grad), fwdbwd (forward + "
                             "backward) (default: %(default)s)")
    parser.add_argument("--json", default="bench.json", metavar="FILE",
                        help="write every measured row and the device name here, rewritten "
                             "after each row so a cut-short run keeps its results "
                             "(default: %(default)s)")
    parser.add_argument("--rep-ms", type=int, default=300, metavar="MS",
                        help="milliseconds of repeated runs per measurement, after 50 ms of "
                             "warm-up (default: %(default)s)")
    parser.add_argument("--bundle", action="append", default=[], metavar="LABEL=DIR",
                        help="time kdagen from this kernel bundle as impl kdagen_LABEL "
                             "(repeatable: compares lowering paths in one process); without "
                             "it, one impl 'kdagen' from KDAGEN_BUNDLE")
    parser.add_argument("--chunk-size", action="append", default=[], metavar="LABEL=C",
                        help="kdagen's chunk size for the impl of bundle LABEL (ablation; the "
                             "bundle must hold variants of that chunk size: "
                             "bench/emit_bench_bundle.py --chunk-size)")
    parser.add_argument("--segments", action="append", default=[], metavar="LABEL=SETTING",
                        help="KDAGEN_SEGMENTS for the impl of bundle LABEL: auto (the cost "
                             "rule), off, beside (the chaining scans beside their chunk "
                             "kernels) or a power of two (intra-card context parallelism of "
                             "training calls, kdagen.runtime.segments; an A/B in one process)")
    parser.add_argument("--no-fla", action="store_true",
                        help="time kdagen only (no FLA or FlashQLA columns or ratios)")
    parser.add_argument("--kernels", action="store_true",
                        help="also time every kernel a kdagen call launches (CUDA events "
                             "around each launch) and print a per-kernel table: grid, threads, "
                             "CTAs per SM, registers, shared memory, median us per call, us "
                             "per chunk step of state scans, bytes moved (the IR's count) and "
                             "%% of the 4.8 TB/s bandwidth floor; written to the JSON as "
                             "\"kernels\"")
    parser.add_argument("--head-dim", type=int, default=128, choices=HEAD_DIMS,
                        help="K = V of every config (default: %(default)s; the bundle must hold "
                             "that head dim: bench/emit_bench_bundle.py --head-dim)")
    parser.add_argument("--kernel-reps", type=int, default=20, metavar="N",
                        help="calls timed per kernel row with --kernels; the table shows the "
                             "median (default: %(default)s)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = [c for c in args.configs.split(",") if c not in ALL_CONFIGS]
    if unknown:
        parser.error(f"--configs {','.join(unknown)}: unknown; choose from "
                     f"{', '.join(ALL_CONFIGS)}")
    bundles = dict(b.split("=", 1) for b in args.bundle)
    chunk_sizes = {k: int(v) for k, v in (c.split("=", 1) for c in args.chunk_size)}
    unknown = set(chunk_sizes) - set(bundles)
    if unknown:
        parser.error(f"--chunk-size {sorted(unknown)}: no --bundle with that label")
    segments = dict(c.split("=", 1) for c in args.segments)
    unknown = set(segments) - set(bundles)
    if unknown:
        parser.error(f"--segments {sorted(unknown)}: no --bundle with that label")
    import torch
    if not torch.cuda.is_available():
        print("kdagen bench needs a CUDA GPU (it times kernels against FLA on the same inputs)",
              file=sys.stderr)
        return 2
    device = "cuda"
    device_name = torch.cuda.get_device_name()
    from kdagen.runtime import launch
    print("references: " + ", ".join(f"{k} {v or '-'}" for k, v in reference_stack().items())
          + f"; kdagen scans beside their chunk kernels: {'on' if launch.OVERLAP else 'off'} "
          "(KDAGEN_OVERLAP)", flush=True)
    rows = []
    kernels = [] if args.kernels else None
    for family in args.ops.split(","):
        impls = implementations(family, fla=not args.no_fla, bundles=bundles,
                                chunk_sizes=chunk_sizes, segments=segments)
        for name in args.configs.split(","):
            B, T, H, HV, lengths = ALL_CONFIGS[name]
            x, kw, T = make_inputs(family, B, T or 0, H, HV, lengths, device,
                                   head_dim=args.head_dim)
            tokens = B * T if lengths is None else T
            longest = max(lengths) if lengths else T
            for mode in args.modes.split(","):
                grad = mode == "fwdbwd"
                row = {"op": family, "config": name, "mode": mode}
                if args.head_dim != 128:
                    row["head_dim"] = args.head_dim
                for impl, fn in impls.items():
                    ctx = torch.enable_grad() if grad else torch.no_grad()
                    try:
                        with ctx:
                            torch.cuda.synchronize()
                            start = time.perf_counter()
                            call(fn, family, x, kw, grad)
                            torch.cuda.synchronize()
                            row[f"{impl}_first_call_s"] = time.perf_counter() - start
                            row[f"{impl}_ms"] = measure(lambda: call(fn, family, x, kw, grad),
                                                        rep_ms=args.rep_ms)
                            row[f"{impl}_host_ms"] = host_enqueue_ms(
                                lambda: call(fn, family, x, kw, grad))
                    except Exception as err:
                        row[f"{impl}_error"] = f"{type(err).__name__}: {err}"[:200]
                        continue
                    if kernels is not None and impl.startswith("kdagen"):
                        context = {"impl": impl, "op": family, "config": name, "mode": mode}
                        kernels += _kernel_rows_of_call(
                            lambda: call(fn, family, x, kw, grad), grad, args.kernel_reps,
                            context, tokens=tokens, value_heads=HV, longest_tokens=longest,
                            sequences=len(lengths) if lengths else B)
                D = args.head_dim
                nbytes = bytes_moved(B, T, H, HV, D, D, family, grad)
                flops = tokens * HV * flops_per_token(D, D, backward=grad)
                floor_ms = 1e3 * max(nbytes / COPY_BYTES_PER_S, flops / MATMUL_FLOPS_PER_S)
                row["floor_ms"] = floor_ms
                for impl in impls:
                    if f"{impl}_ms" in row:
                        row[f"{impl}_pct_floor"] = 100 * floor_ms / row[f"{impl}_ms"]
                for impl in impls:
                    for ref in REFERENCES:
                        if impl.startswith("kdagen") and f"{impl}_ms" in row and f"{ref}_ms" in row:
                            row[f"ratio_{ref}_over_{impl}"] = row[f"{ref}_ms"] / row[f"{impl}_ms"]
                rows.append(row)
                print(json.dumps(row), flush=True)
                _write_json(args.json, rows, kernels, device_name)   # kept if cut short
    print("\n" + "\n".join(summary_table(rows)))
    if kernels:
        print("\nper kernel (median us per call over --kernel-reps calls; us/step: state scans, "
              "per chunk of the longest sequence; % floor: HBM bytes at 4.8 TB/s / us; L2 MB: "
              "what the kernel's global loads and stores move between L1 and L2, counted "
              "statically, TMA copies not included)")
        print(kernel_table.format_kernel_table(kernels))
    _write_json(args.json, rows, kernels, device_name)
    return 0


if __name__ == "__main__":
    main()
