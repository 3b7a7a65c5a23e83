"""GPU check of user gates through the public API, against the float64 reference.

Needs torch + cuda-bindings + this repository (no MLIR): the gate files import without the
compiler, and the kernels come from a bundle emitted elsewhere::

    # where the compiler is (the bundle holds each gate's forward + backward for sm_90a):
    kdagen emit --gates examples/gates/sq_sigmoid.py --gates examples/gates/kda_channel_rate.py \\
        --gates examples/gates/gdn_temperature.py --arch sm_90a -o .bundles/gates
    # on the GPU machine:
    KDAGEN_BUNDLE=.bundles/gates python -m tools.gate_gpu_check examples/gates/*.py

For every gate of the files and weak / strong decay (the file's ``sample_params``), it calls
``kdagen.chunk_kda`` / ``chunk_gated_delta_rule`` with ``gate=`` on CUDA (bf16 q, k, v, raw gate
and beta; fp32 parameters and initial state; K = V = 128), backpropagates random cotangents, and
compares o, the final state and every gradient (parameters included) with autograd of
``kdagen.reference`` on the same inputs in float64 (the gate evaluated by ``Gate.torch``).
Prints one line per tensor: rel_err, the bf16 floor (the reference rounded to the output
dtype), the goal (2e-3 for bf16 tensors, 1e-3 for fp32 ones; a bf16 tensor whose error is
within 5% of its rounding floor passes as "at floor") and the status. Exit 1 on a miss.
"""
from __future__ import annotations

import argparse
import sys

import torch

import kdagen
from kdagen import reference as R
from kdagen.ir.gates import load_gate_file

GOAL = {torch.bfloat16: 2.0e-3, torch.float32: 1.0e-3}


def _case(gate, module, decay, T, H, seed):
    gen = torch.Generator().manual_seed(seed)
    K = V = 128
    HV = H
    dev = "cuda"
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)   # noqa: E731
    gshape = (1, T, HV, K) if gate.family == "kda" else (1, T, HV)
    x = {"q": rnd(1, T, H, K), "k": rnd(1, T, H, K), "v": rnd(1, T, HV, V),
         "g": rnd(*gshape) - 1.0, "beta": rnd(1, T, HV)}
    x = {n: t.to(torch.bfloat16).to(dev) for n, t in x.items()}
    params = {n: t.float().to(dev) for n, t in module.sample_params(HV, K, decay, gen).items()}
    h0 = (rnd(1, HV, K, V) * 0.5).float().to(dev)
    do = rnd(1, T, HV, V).to(torch.bfloat16).to(dev)
    dht = rnd(1, HV, K, V).float().to(dev)
    return x, params, h0, do, dht


def check_gate(gate, module, decay, T=512, H=2, seed=0):
    x, params, h0, do, dht = _case(gate, module, decay, T, H, seed)
    fn = kdagen.chunk_kda if gate.family == "kda" else kdagen.chunk_gated_delta_rule
    leaves = {n: t.clone().requires_grad_(True) for n, t in {**x, **params, "h0": h0}.items()}
    kw = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              output_final_state=True, gate=gate.name)
    o, ht = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
               initial_state=leaves["h0"], gate_params={n: leaves[n] for n in params}, **kw)
    torch.autograd.backward([o, ht], [do, dht])
    torch.cuda.synchronize()
    got = {"o": o.detach(), "final_state": ht.detach(),
           **{"d" + n: t.grad for n, t in leaves.items()}}

    def ref_fn(q, k, v, g, beta, h0, **p):
        return (R.chunk_kda if gate.family == "kda" else R.chunk_gated_delta_rule)(
            q, k, v, g, beta, initial_state=h0, gate=gate, gate_params=p, **{
                k2: v2 for k2, v2 in kw.items() if k2 != "gate"})

    cpu = {n: t.detach().cpu() for n, t in {**x, **params, "h0": h0}.items()}
    ref = R.reference_grads(ref_fn, cpu, do.cpu(), dht.cpu())
    lines, ok = [], True
    for name, out in got.items():
        want = ref["o" if name == "o" else name if name == "final_state" else name[1:]]
        if out is None or want is None:
            lines.append((name, float("nan"), 0.0, 0.0, "MISSING"))
            ok = False
            continue
        err = R.rel_err(out.cpu(), want)
        floor = R.rel_err(want.to(out.dtype).to(torch.float64), want)
        goal = GOAL.get(out.dtype, 2.0e-3)
        finite = bool(torch.isfinite(out).all())
        # a bf16 tensor's goal is the larger of 2e-3 and its rounding floor (+5%): no kernel
        # can beat the error of rounding the exact result to bf16
        at_floor = err <= 1.05 * floor
        status = ("NONFINITE" if not finite else "ok" if err <= goal else
                  "ok (at floor)" if at_floor else "over goal")
        ok &= status.startswith("ok")
        lines.append((name, err, floor, goal, status))
    return ok, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="gate files (define_gate + sample_params)")
    ap.add_argument("--T", type=int, default=512)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    all_ok = True
    print(f"{'gate':<18} {'decay':<6} {'tensor':<12} {'rel_err':>10} {'floor':>10} {'goal':>8}  status")
    for path in args.files:
        for gate in load_gate_file(path):
            module = sys.modules[gate.fn.__module__]
            for decay in ("weak", "strong"):
                ok, lines = check_gate(gate, module, decay, T=args.T)
                all_ok &= ok
                for name, err, floor, goal, status in lines:
                    print(f"{gate.name:<18} {decay:<6} {name:<12} {err:10.3e} {floor:10.3e} "
                          f"{goal:8.1e}  {status}")
    print("all ok" if all_ok else "SOME CHECKS MISSED THEIR GOAL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
