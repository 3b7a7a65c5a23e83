"""Does the tensor core drop (truncate) the low 13 bits of a TF32 operand? One Triton dot with
``input_precision="tf32"`` (wgmma on sm_90) on operands whose low 13 bits are set, printed
beside what truncation and rounding would give, and whether the PTX rounds first (``cvt.rna``).
kdagen's register-resident scans rely on truncation (`kdagen.codegen.common.convert.
tf32_operand_bits`).

    python bench/tf32_truncation_probe.py   # on a GPU machine with Triton
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b, input_precision="tf32"))


def main() -> int:
    M = N = 64
    K = 16
    bits = [0x3F800000, 0x3F801000, 0x3F801FFF, 0x3F802000, 0x3F803000, 0xBF801000]
    a = torch.zeros(M, K, dtype=torch.float32)
    vals = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    a[:len(bits), 0] = vals
    b = torch.zeros(K, N, dtype=torch.float32)
    b[0, :] = 1.0
    a, b = a.cuda(), b.cuda()
    c = torch.empty(M, N, dtype=torch.float32, device="cuda")
    k = _dot[(1,)](a, b, c, M, N, K, num_warps=4)
    torch.cuda.synchronize()
    ptx = k.asm.get("ptx", "")
    print(f"device: {torch.cuda.get_device_name()}; PTX has cvt.rna.tf32: {'cvt.rna.tf32' in ptx}; "
          f"wgmma: {'wgmma' in ptx}")
    print(f"{'a bits':>10s} {'a':>14s} {'dot(a, 1)':>14s} {'truncated':>14s} {'rounded':>14s}")
    for i, x in enumerate(bits):
        t = torch.tensor([x & ~0x1FFF], dtype=torch.int64).to(torch.int32).view(torch.float32)
        r = torch.tensor([(x + 0x1000) & ~0x1FFF], dtype=torch.int64).to(torch.int32).view(torch.float32)
        got = c[i, 0].item()
        print(f"{x:#10x} {vals[i].item():14.9f} {got:14.9f} {t.item():14.9f} {r.item():14.9f}"
              f"  {'truncates' if got == t.item() else 'rounds' if got == r.item() else '?'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
