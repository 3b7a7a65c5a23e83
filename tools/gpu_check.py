"""GPU check of lowered kernels against the float64 reference (runs where there is a GPU).

Needs only torch + cuda-bindings + this repository (no MLIR)::

    python -m tools.gpu_check BUNDLE [--variant SUBSTRING] [--quick]

For every program variant in BUNDLE/lowered.json (written by ``python -m tools.check_bundle``)
and a few shapes, it draws random bf16/fp16 inputs, runs the variant's kernels (outputs
poisoned with NaN first), runs the float64 per-token reference of ``kdagen.reference`` on the
*same* (storage-rounded) inputs, and prints one line per output tensor:

    variant  case  tensor  rel_err  bar  floor  status

``rel_err = ||out - ref|| / ||ref||`` (docs/MATH.md §3), ``bar`` the project's bar for that tensor,
``floor`` = the error of rounding the reference itself to the output dtype (what no kernel can
beat). It also checks: no NaN/Inf anywhere in the outputs (padding included), bitwise identical
results on a second run (determinism), and reports the kernel time of each case (second run).
Exit status 0 when every check passes, 1 otherwise.
"""
from __future__ import annotations

import argparse
import math
import sys
import traceback

import torch

from kdagen import reference as R
from kdagen.ops import RESIDUALS
from kdagen.runtime.launch import LoweredProgram, list_variants

BARS = {"o": 0.005, "final_state": 0.005, "dq": 0.008, "dk": 0.008, "dv": 0.008, "dh0": 0.008,
        "dg_raw": 0.02, "dg": 0.02, "dbeta_raw": 0.02, "dbeta": 0.02, "dA_log": 0.008,
        "ddt_bias": 0.008}
GRAD_OF = {"q": "dq", "k": "dk", "v": "dv", "g_raw": "dg_raw", "g": "dg", "beta_raw": "dbeta_raw",
           "beta": "dbeta", "A_log": "dA_log", "dt_bias": "ddt_bias", "initial_state": "dh0"}
_DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "fp16": torch.float16,
       "fp32": torch.float32}
_INT = {"i32": torch.int32, "i64": torch.int64}


def _cases(spec: dict, quick: bool) -> list[dict]:
    bwd = spec["program"].endswith("_bwd")
    if spec["program"].endswith("_decode"):
        # decode steps: 1..8 tokens per sequence from a given state
        if spec["varlen"]:
            cases = [dict(label="varlen[1,8,3,5]", B=1, lengths=[1, 8, 3, 5], decay="moderate"),
                     dict(label="varlen[1,4] strong", B=1, lengths=[1, 4], decay="strong"),
                     dict(label="varlen[8,2] weak", B=1, lengths=[8, 2], decay="weak")]
        else:
            cases = [dict(label=f"B{b}_T{t}", B=b, T=t, decay="moderate")
                     for b, t in ((64, 1), (4, 3), (1, 8))]
            cases += [dict(label="B8_T4 strong", B=8, T=4, decay="strong"),
                      dict(label="B8_T4 weak", B=8, T=4, decay="weak")]
        return cases[:2] if quick else cases
    if spec["varlen"]:
        lens = [[1, 17, 129]] if bwd else [[1, 17, 64, 129, 1000], [63, 65]]
        cases = [dict(label=f"varlen{l}", B=1, lengths=l, decay="moderate") for l in lens]
        cases.append(dict(label="varlen[70,200] strong", B=1, lengths=[70, 200], decay="strong"))
        cases.append(dict(label="varlen[1,300] weak", B=1, lengths=[1, 300], decay="weak"))
        cases.append(dict(label="varlen[70,200] out-of-range", B=1, lengths=[70, 200],
                          decay="extreme"))
    else:
        shapes = [(1, 65), (2, 1)] if bwd else [(2, 1), (1, 63), (2, 65), (1, 1000)]
        cases = [dict(label=f"B{b}_T{t}", B=b, T=t, decay="moderate") for b, t in shapes]
        cases.append(dict(label="B1_T200 strong", B=1, T=200, decay="strong"))
        cases.append(dict(label="B1_T1000 weak", B=1, T=1000, decay="weak"))
        # gates falling by far more than 64 (log2) across 16 tokens: the decay products'
        # diagonal blocks take their exact fallback (tiles.FACTORED_SPAN_MAX) in every chunk
        cases.append(dict(label="B1_T200 steep", B=1, T=200, decay="steep"))
        # FLA's own test_chunk case (D = 100, gate_logit_normalizer 0.1): positive keys, so
        # every pair of keys is strongly correlated, and g = logsigmoid(randn) / 0.1, steep
        # with a heavy tail; it caught the TF32 merge of the unit-lower inverse
        cases.append(dict(label="B1_T200 correlated steep", B=1, T=200, decay="correlated"))
        cases.append(dict(label="B1_T200 out-of-range", B=1, T=200, decay="extreme"))
    if quick:
        cases = cases[:2]
    return cases


def _inputs(spec: dict, case: dict, device, seed: int) -> tuple[dict, dict]:
    """(kernel inputs in storage dtypes, the same values in float64 for the reference)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    attrs = spec["attrs"]
    fam = spec["family"]
    K, V = int(attrs["head_k_dim"]), int(attrs["head_v_dim"])
    ratio = int(spec["gva_ratio"])
    H = 2
    HV = H * ratio
    if case.get("lengths"):
        lengths = case["lengths"]
        B, T = 1, sum(lengths)
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int64)
        N = len(lengths)
    else:
        B, T = case["B"], case["T"]
        cu, N = None, case["B"]
    correlated = case["decay"] == "correlated"
    steep = case["decay"] in ("steep", "correlated")
    strong = case["decay"] == "strong" or steep
    gate = attrs.get("gate", "")

    def rnd(*s, scale=1.0):
        return torch.randn(*s, generator=g, dtype=torch.float64) * scale

    x = {"q": rnd(B, T, H, K), "k": rnd(B, T, H, K), "v": rnd(B, T, HV, V)}
    if correlated:      # FLA's test inputs: uniform [0, 1) keys and queries, unit rows
        for n in ("q", "k"):
            u = torch.rand(B, T, H, K, generator=g, dtype=torch.float64)
            x[n] = u / u.norm(dim=-1, keepdim=True)
    gshape = (B, T, HV, K) if fam == "kda" else (B, T, HV)
    names = {a["name"]: a for a in spec["args"]}
    weak = case["decay"] == "weak"
    if "g" in names:
        lb = (attrs.get("gate_options") or {}).get("lower_bound")
        span = -(lb if lb is not None else (-20.0 if steep else -5.0 if strong else -1.0))
        x["g"] = -torch.rand(*gshape, generator=g, dtype=torch.float64) * (0.01 if weak else span)
        if correlated:
            x["g"] = torch.nn.functional.logsigmoid(rnd(*gshape)) / 0.1
    elif weak:
        # g ~ -0.005 per token (PERF.md §4: weak decay exposes state-path rounding):
        # exp(A_log) = 1, dt_bias = 0, softplus(g_raw) ~ 0.005 or lb * sigmoid(g_raw) ~ 0.005
        x["g_raw"] = rnd(*gshape, scale=0.1) + (-6.9 if "lower_bound" in gate else -5.3)
        if "A_log" in names:
            x["A_log"] = torch.zeros(HV, dtype=torch.float64)
        if "dt_bias" in names:
            x["dt_bias"] = torch.zeros((HV, K) if fam == "kda" else (HV,), dtype=torch.float64)
    else:
        if "lower_bound" in gate:
            x["g_raw"] = rnd(*gshape) + (6.0 if strong else 0.0)
        else:
            x["g_raw"] = rnd(*gshape) + (1.0 if steep else -3.0 if strong else -1.0)
        if "A_log" in names:
            x["A_log"] = torch.full((HV,), math.log(16.0), dtype=torch.float64) if strong else rnd(HV, scale=0.5)
        if "dt_bias" in names:
            x["dt_bias"] = rnd(HV, K, scale=0.5) if fam == "kda" else rnd(HV, scale=0.5)
    if case["decay"] == "extreme":
        # gates outside their declared ranges, which the kernels enforce (kdagen.ir.gate_ranges):
        # raw gates of +-inf and 1e6 on whole tokens, a precomputed g below its promised lower
        # bound over more than a chunk (or far below the floor) and one token of -inf
        if "g_raw" in x:
            t = x["g_raw"]
            t[:, T // 7] = math.inf
            t[:, T // 3] = -math.inf
            t[:, T // 2] = 1e6
            t[:, T // 2 + 1] = -1e6
        else:
            lb = (attrs.get("gate_options") or {}).get("lower_bound")
            t = x["g"]
            t[:, T // 5: T // 5 + 80] = 1.6 * lb if lb is not None else -1e4
            t[:, T // 3] = -math.inf
    bname = "beta_raw" if "beta_raw" in names else "beta"
    x[bname] = rnd(B, T, HV) if bname == "beta_raw" else torch.sigmoid(rnd(B, T, HV))
    slots = None
    if "state_slots" in names:
        # a state pool (decode with state_pool): 3 slots more than sequences, the sequences'
        # slots in random order, one sequence skipped (negative slot)
        # (stored [slots, HV, V, K] for a value-first pool: state_v_first)
        x["initial_state"] = rnd(N + 3, HV, *((V, K) if _v_first(spec) else (K, V)), scale=0.5)
        slots = torch.randperm(N + 3, generator=g)[:N]
        if N > 1:
            slots[N // 2] = -1
    elif "initial_state" in names:
        x["initial_state"] = rnd(N, HV, K, V, scale=0.5)
    if "do" in names:
        x["do"] = rnd(B, T, HV, V)
    if "dht" in names:
        x["dht"] = rnd(N, HV, K, V)
    kern, ref = {}, {}
    for name, val in x.items():
        a = names[name]
        t = val.to(_DT.get(a["dtype"], torch.float32))
        kern[name] = t.to(device)
        ref[name] = t.to(torch.float64).to(device)
    if cu is not None:
        kern["cu_seqlens"] = cu.to(device)
        ref["cu_seqlens"] = cu.to(device)
    if slots is not None:
        kern["state_slots"] = slots.to(_INT[names["state_slots"]["dtype"]]).to(device)
        kern["final_state"] = kern["initial_state"]          # the pool, updated in place
        ref["state_slots"] = slots.to(device)
    return kern, ref


def _v_first(spec: dict) -> bool:
    """Whether the variant's states are stored [.., V, K] (the decode option state_v_first)."""
    return bool((spec.get("attrs") or {}).get("state_v_first", False))


def _pool_refs(fn, ref_in: dict, v_first: bool = False) -> dict:
    """o and the updated pool of a state-pool decode step: the reference from the sequences'
    slots (zeros for a skipped sequence), o zero on a skipped sequence's tokens, the final
    states written to their slots and every other row as it was. ``v_first``: the pool's rows
    are stored transposed, [V, K] (so is the returned pool)."""
    x = dict(ref_in)
    pool, slots = x.pop("initial_state"), x.pop("state_slots")
    if v_first:
        pool = pool.transpose(-1, -2)                   # the states as [.., K, V]
    live = slots >= 0
    h0 = torch.where(live.view(-1, 1, 1, 1), pool[slots.clamp(min=0)], torch.zeros_like(pool[:1]))
    with torch.no_grad():
        o, ht = fn(**x, initial_state=h0)
    B, T = o.shape[:2]
    cu = x.get("cu_seqlens")
    tok = torch.arange(B * T, device=o.device)
    seq = tok // T if cu is None else torch.searchsorted(cu[1:], tok, right=True)
    o = o * live[seq].view(B, T, 1, 1).to(o.dtype)
    new = pool.clone()
    new[slots[live]] = ht[live]
    return {"o": o, "final_state": new.transpose(-1, -2) if v_first else new}


def _reference_fn(spec: dict):
    attrs = spec["attrs"]
    fam = spec["family"]
    gate = attrs.get("gate", "")
    opts = attrs.get("gate_options") or {}
    builtin = gate in ("softplus", "lower_bound", "gdn_softplus", "gdn_lower_bound")
    pre = gate in ("precomputed", "gdn_precomputed")
    if not (builtin or pre):
        return None
    lb = opts.get("lower_bound", -5.0) if "lower_bound" in gate else None

    def fn(**x):
        beta = x.get("beta_raw", x.get("beta"))
        kw = dict(scale=x.get("scale"), initial_state=x.get("initial_state"), output_final_state=True,
                  use_qk_l2norm_in_kernel=bool(attrs.get("use_qk_l2norm_in_kernel", True)),
                  use_beta_sigmoid_in_kernel=bool(attrs.get("use_beta_sigmoid_in_kernel", True)),
                  allow_neg_eigval=bool(attrs.get("allow_neg_eigval", False)),
                  cu_seqlens=x.get("cu_seqlens"))
        if builtin:
            kw.update(use_gate_in_kernel=True, safe_gate=lb is not None, lower_bound=lb,
                      A_log=x.get("A_log"), dt_bias=x.get("dt_bias"))
            gin = x["g_raw"]
        else:   # a precomputed gate, clamped to its enforced range as the kernels clamp it
            gin = R.clamp_gate(x["g"], opts.get("lower_bound"))
        f = R.chunk_kda if fam == "kda" else R.chunk_gated_delta_rule
        return f(x["q"], x["k"], x["v"], gin, beta, **kw)

    return fn


def _floor(ref: torch.Tensor, dtype) -> float:
    if dtype in (torch.float32, torch.float64):
        return 0.0
    return R.rel_err(ref.to(dtype), ref)


def residual_source(bundle, variants: dict, spec: dict):
    """The forward variant whose residuals a backward variant built with save_residuals reads
    (same options, in the same bundle), as a LoweredProgram; None for any other variant."""
    if not (spec["program"].endswith("_bwd") and (spec.get("options") or {}).get("save_residuals")):
        return None
    fwd = spec["program"][:-len("_bwd")] + "_fwd"
    for name, other in variants.items():
        # the same options and the same lowering (a bundle may hold one per lowering, e.g.
        # stand-ins for several chips, whose residual precisions differ)
        if other["program"] == fwd and other.get("options") == spec.get("options") \
                and other.get("pipeline") == spec.get("pipeline") \
                and other.get("lower") == spec.get("lower"):
            return LoweredProgram(bundle, name)
    raise LookupError(f"{spec['program']} with save_residuals: the bundle has no {fwd} of the "
                      f"same options to produce its residuals")


def run_case(prog: LoweredProgram, spec: dict, case: dict, device, seed: int,
             residuals_from: LoweredProgram | None = None) -> list[dict]:
    kern, ref_in = _inputs(spec, case, device, seed)
    if residuals_from is not None:
        # what the forward wrote for this backward, on the same inputs
        fwd_in = {k: v for k, v in kern.items() if k not in ("do", "dht")}
        fwd_out = residuals_from(device=device, **fwd_in)
        kern.update({k: v for k, v in fwd_out.items() if k in RESIDUALS})
    fn = _reference_fn(spec)
    names = {a["name"]: a for a in spec["args"]}
    rows = []
    cuda = torch.device(device).type == "cuda"

    def run(**kw):
        args = dict(kern)
        if "state_slots" in kern:       # in place: every run on a fresh copy of the pool
            pool = kern["initial_state"].clone()
            args.update(initial_state=pool, final_state=pool)
        return prog(device=device, **args, **kw)
    out1 = run()
    if cuda:
        torch.cuda.synchronize()
    out2 = run()
    ms = float("nan")
    if cuda:
        torch.cuda.synchronize()
        reps = 3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            run(poison=False)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / reps
    deterministic = all(torch.equal(out1[k].view(torch.uint8) if out1[k].dtype != torch.int64 else out1[k],
                                    out2[k].view(torch.uint8) if out2[k].dtype != torch.int64 else out2[k])
                        for k in out1)
    if fn is None:
        for k, v in out1.items():
            rows.append(dict(tensor=k, err=float("nan"), bar=None, floor=None, finite=bool(torch.isfinite(v.float()).all()),
                             det=deterministic, ms=ms, note="no reference for this gate"))
        return rows
    refs = {}
    if "state_slots" in kern:                          # decode on a state pool
        refs = _pool_refs(fn, ref_in, _v_first(spec))
    elif not spec["program"].endswith("_bwd"):        # forward and decode: o, final_state
        with torch.no_grad():
            o, ht = fn(**ref_in)
        refs = {"o": o, "final_state": ht}
    else:
        inputs = {k: v for k, v in ref_in.items() if k not in ("do", "dht")}
        grads = R.reference_grads(lambda **x: fn(**x), inputs, ref_in["do"], ref_in.get("dht"))
        for k, v in grads.items():
            if k in GRAD_OF and v is not None:
                refs[GRAD_OF[k]] = v
    for k, v in out1.items():
        if k in RESIDUALS:
            # residuals: the rows of the chunks (the buffer's bound may hold more, unwritten)
            C = int(spec["chunk_size"])
            lens = case.get("lengths") or [case["T"]] * case["B"]
            v = v[:sum(-(-n // C) for n in lens)]
        finite = bool(torch.isfinite(v.float()).all())
        r = refs.get(k)
        if r is None:
            rows.append(dict(tensor=k, err=float("nan"), bar=BARS.get(k), floor=None, finite=finite,
                             det=deterministic, ms=ms, note="no reference value"))
            continue
        r = r.reshape(v.shape) if r.numel() == v.numel() else r
        err = R.rel_err(v.to(torch.float64), r)
        rows.append(dict(tensor=k, err=err, bar=BARS.get(k), floor=_floor(r, v.dtype), finite=finite,
                         det=deterministic, ms=ms, note=""))
    return rows


def bench(bundle, names, variants, device) -> None:
    """Time of each variant at B=1, T=8192, HV=16 (median of 5 runs), and per kernel."""
    print("\nTIMING (B=1 T=8192 HV=16, all kernels of the variant, median of 5; then per kernel):")
    for vname in names:
        spec = variants[vname]
        try:
            prog = LoweredProgram(bundle, vname)
            ratio = int(spec["gva_ratio"])
            case = (dict(label="bench", B=1, lengths=[8192], decay="moderate") if spec["varlen"]
                    else dict(label="bench", B=1, T=8192, decay="moderate"))
            kern, _ = _inputs(spec, case, device, 0)
            # _inputs uses H = 2 q/k heads; widen to HV = 16 value heads
            H = 16 // ratio
            kern = _widen(kern, spec, H, ratio)
            prog(device=device, **kern)
            torch.cuda.synchronize()
            runs = []
            for _ in range(5):
                profile: list = []
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                prog(device=device, poison=False, profile=profile, **kern)
                b.record()
                torch.cuda.synchronize()
                runs.append((a.elapsed_time(b), [(n, s.elapsed_time(e)) for n, s, e in profile]))
            runs.sort(key=lambda r: r[0])
            total, per_kernel = runs[2]
            print(f"  {vname:58s} {total:9.3f} ms")
            for kname, ms in per_kernel:
                print(f"      {kname.split('__')[-1]:40s} {ms:9.3f} ms")
        except Exception as exc:  # noqa: BLE001
            print(f"  {vname:58s} ERROR {type(exc).__name__}: {exc}")


def _widen(kern: dict, spec: dict, H: int, ratio: int) -> dict:
    HV = H * ratio
    out = {}
    for name, x in kern.items():
        a = next((a for a in spec["args"] if a["name"] == name), None)
        if a is None or not x.is_floating_point():
            out[name] = x
            continue
        if a["layout"] == "token":
            heads = H if a["heads"] == "qk" else HV
            reps = [1] * x.dim()
            reps[2] = -(-heads // x.shape[2])
            out[name] = x.repeat(*reps)[:, :, :heads].contiguous()
        elif a["layout"] in ("head", "state", "pool"):
            dim = 0 if a["layout"] == "head" else 1
            reps = [1] * x.dim()
            reps[dim] = -(-HV // x.shape[dim])
            out[name] = x.repeat(*reps).narrow(dim, 0, HV).contiguous()
        else:
            out[name] = x
    if kern.get("final_state") is not None and kern["final_state"] is kern.get("initial_state"):
        out["final_state"] = out["initial_state"]          # a pool updated in place
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--variant", default=None, help="only variants whose name contains this")
    ap.add_argument("--quick", action="store_true", help="two shapes per variant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bench", action="store_true",
                    help="also time the variants at B=1, T=8192, HV=16, per kernel (no reference)")
    ap.add_argument("--bench-only", action="store_true", help="timing only, no correctness checks")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing to check")
        return 1
    device = torch.device("cuda", torch.cuda.current_device())
    from kdagen.runtime.chips import chip_for_device
    chip = chip_for_device(device.index)
    print(f"kdagen lowered-kernel GPU check: bundle {args.bundle}")
    print(f"device {torch.cuda.get_device_name(device)} ({chip}), torch {torch.__version__}")
    print("rel_err = ||out - ref||2 / ||ref||2 vs the float64 per-token reference on the same "
          "storage-rounded inputs;")
    print("floor = rel_err of the reference rounded to the output dtype; bar = docs/MATH.md §3; "
          "det = bitwise identical on a rerun; ms = mean time of one full run (all kernels)")
    variants = list_variants(args.bundle)
    names = [v for v in variants if args.variant is None or args.variant in v]
    hdr = f"{'variant':58s} {'case':26s} {'tensor':12s} {'rel_err':>9s} {'bar':>6s} {'floor':>8s} {'finite':>6s} {'det':>4s} {'ms':>8s}  status"
    print(hdr)
    print("-" * len(hdr))
    n_ok = n_bad = n_err = 0
    for vname in ([] if args.bench_only else names):
        spec = variants[vname]
        try:
            prog = LoweredProgram(args.bundle, vname)
            source = residual_source(args.bundle, variants, spec)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{vname:58s} {'(load)':26s} ERROR {type(exc).__name__}: {exc}")
            n_err += 1
            continue
        for ci, case in enumerate(_cases(spec, args.quick)):
            try:
                rows = run_case(prog, spec, case, device, args.seed + ci, source)
            except Exception as exc:  # noqa: BLE001
                print(f"{vname:58s} {case['label']:26s} ERROR {type(exc).__name__}: {exc}")
                traceback.print_exc(limit=3, file=sys.stdout)
                n_err += 1
                continue
            for r in rows:
                bar = r["bar"]
                ok = r["finite"] and r["det"] and (bar is None or (r["err"] == r["err"] and r["err"] <= bar))
                status = "ok" if ok else "FAIL"
                if r["note"]:
                    status += f" ({r['note']})"
                n_ok += ok
                n_bad += not ok
                print(f"{vname:58s} {case['label']:26s} {r['tensor']:12s} {r['err']:9.2e} "
                      f"{(bar if bar is not None else float('nan')):6.3f} "
                      f"{(r['floor'] if r['floor'] is not None else float('nan')):8.2e} "
                      f"{str(r['finite']):>6s} {str(r['det'])[0]:>4s} {r['ms']:8.3f}  {status}",
                      flush=True)
    print("-" * len(hdr))
    print(f"SUMMARY: {n_ok} ok, {n_bad} FAIL, {n_err} ERROR  ({len(names)} variants)")
    if args.bench or args.bench_only:
        bench(args.bundle, names, variants, device)
    return 0 if (n_bad == 0 and n_err == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
