"""FLA's decode kernels at serving batch sizes, against the bandwidth their states need (GPU).

    python bench/fla_decode_probe.py [--json bench/results/h200_fla_decode.json]

The baseline for the decode issue: one token per sequence (T = 1), K = V = 128, an fp32 state
pool updated in place through ``ssm_state_indices`` (KDA: ``fused_recurrent_kda_fwd``) or read
and written back (GDN: ``fused_recurrent_gated_delta_rule``). Each call is captured in a CUDA
graph and replayed (servers capture decode), timed by ``triton.testing.do_bench_cudagraph``.
"bytes" is the state read once and written once (q/k/v/g are small beside it); "copy" is a
device copy of the same bytes (read + write), the practical ceiling on this machine.
"""
from __future__ import annotations

import argparse
import json
import os

import torch


def _inputs(op: str, N: int, HV: int, K: int, dev):
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, device=dev) * scale).to(torch.bfloat16)
    q, k, v = rnd(N, 1, HV, K), rnd(N, 1, HV, K), rnd(N, 1, HV, K)
    k = torch.nn.functional.normalize(k.float(), dim=-1).to(torch.bfloat16)
    beta = torch.sigmoid(rnd(N, 1, HV).float()).to(torch.bfloat16)
    if op == "kda":
        g = -torch.nn.functional.softplus(rnd(N, 1, HV, K).float()).to(torch.bfloat16)
    else:
        g = -torch.nn.functional.softplus(rnd(N, 1, HV).float()).to(torch.bfloat16)
    state = torch.randn(N, HV, K, K, generator=gen, device=dev) * 0.1
    return q, k, v, g, beta, state


def _call(op: str, x, indices):
    q, k, v, g, beta, state = x
    if op == "kda":
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
        return lambda: fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=state,
                                               inplace_final_state=True,
                                               ssm_state_indices=indices)
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    return lambda: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta,
                                                    initial_state=state,
                                                    output_final_state=True)


def state_copy(state: torch.Tensor) -> tuple[int, float]:
    """(bytes of the state read once and written once, us of a device copy of them)."""
    from triton.testing import do_bench_cudagraph
    src = torch.empty_like(state)
    return 2 * state.numel() * state.element_size(), \
        do_bench_cudagraph(lambda: src.copy_(state), rep=200) * 1e3


def add_size_arguments(ap: argparse.ArgumentParser) -> None:
    """The decode sizes both decode benchmarks sweep, and their JSON output."""
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--heads", default="16,32")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--json", default=None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_arguments(ap)
    args = ap.parse_args(argv)
    from triton.testing import do_bench_cudagraph
    dev = torch.device("cuda")
    K = args.head_dim
    rows = []
    for op in ("kda", "gdn"):
        for HV in map(int, args.heads.split(",")):
            for N in map(int, args.batches.split(",")):
                x = _inputs(op, N, HV, K, dev)
                indices = torch.arange(N, device=dev, dtype=torch.int32)
                fn = _call(op, x, indices)
                fn()                                   # compile / autotune outside capture
                torch.cuda.synchronize()
                us = do_bench_cudagraph(fn, rep=200) * 1e3
                nbytes, copy_us = state_copy(x[5])
                rows.append(dict(op=op, N=N, HV=HV, K=K, us=us, copy_us=copy_us,
                                 state_MB=nbytes / 1e6, GBps=nbytes / us / 1e3,
                                 copy_GBps=nbytes / copy_us / 1e3,
                                 pct_of_copy=100 * copy_us / us))
                r = rows[-1]
                print(f"{op:4s} N={N:4d} HV={HV:3d} K={K}  fla {us:8.2f} us  "
                      f"{r['GBps']:7.0f} GB/s  copy {copy_us:8.2f} us {r['copy_GBps']:7.0f} GB/s"
                      f"  fla at {r['pct_of_copy']:5.1f}% of copy", flush=True)
    if args.json:
        write_json(args.json, rows)
    return 0


def write_json(path: str, rows: list) -> None:
    """The measured rows and the device name, as JSON at ``path``."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
