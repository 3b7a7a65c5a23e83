"""KDA gate activation fused with the within-chunk cumsum, over ``[T, H, K]``.

    g      = -exp(A_log[h]) · softplus(g_raw[t, h, k] + dt_bias[h, k])      (natural log)
    gamma2 = log2(e) · Σ_{s ≤ t, s in t's chunk} g[s, h, k]                   (log2 units)

The output is in log2 units because every consumer multiplies by exp2 (docs/MATH.md §1).
Grid: (⌈T / C⌉, H); one thread per channel k (block = K threads); each thread walks the rows of
its chunk, so the cumsum is a register accumulation and reads/writes are coalesced across k.
Tail chunk: the row loop stops at T.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..._mlir import arith, ir, scf
from ..common import fastmath
from ..common.kernel import GpuModuleBuilder, Param, const_f32, const_i32, to_index
from ..common.memory import load_f32, store_from_f32
from ..common.sreg import block_idx, thread_idx


@dataclass(frozen=True)
class GateCumsumSpec:
    head_dim: int = 128
    chunk_size: int = 64
    input_dtype: str = "bf16"

    @property
    def name(self) -> str:
        return f"kda_gate_cumsum_K{self.head_dim}_C{self.chunk_size}_{self.input_dtype}"

    def params(self) -> list[Param]:
        return [
            Param("g_raw", "ptr", self.input_dtype),
            Param("A_log", "ptr", "f32"),
            Param("dt_bias", "ptr", "f32"),
            Param("gamma2", "ptr", "f32"),
            Param("T", "i32"),
            Param("H", "i32"),
        ]

    def launch(self) -> dict:
        return {
            "grid": ["ceil_div(T, %d)" % self.chunk_size, "H", "1"],
            "block": [self.head_dim, 1, 1],
            "dynamic_shared_memory": 0,
        }


def build_gate_cumsum(builder: GpuModuleBuilder, spec: GateCumsumSpec) -> None:
    with builder.kernel(spec.name, spec.params(), (spec.head_dim, 1, 1)) as p:
        i32 = ir.IntegerType.get_signless(32)
        chunk, head, channel = block_idx("x"), block_idx("y"), thread_idx("x")
        head_dim = const_i32(spec.head_dim)

        decay_rate = fastmath.exp(load_f32(p["A_log"], head, "f32"))
        bias = load_f32(p["dt_bias"], arith.addi(arith.muli(head, head_dim), channel), "f32")

        first_row = arith.muli(chunk, const_i32(spec.chunk_size))
        rows = arith.minsi(const_i32(spec.chunk_size), arith.subi(p["T"], first_row))
        row_stride = arith.muli(p["H"], head_dim)            # elements between consecutive t
        column = arith.addi(arith.muli(head, head_dim), channel)
        neg_rate_log2e = arith.mulf(decay_rate, const_f32(-fastmath.LOG2E))

        loop = scf.ForOp(to_index(const_i32(0)), to_index(rows), to_index(const_i32(1)),
                         [const_f32(0.0)])
        with ir.InsertionPoint(loop.body):
            row = arith.addi(first_row, arith.index_cast(i32, loop.induction_variable))
            offset = arith.addi(arith.muli(row, row_stride), column)
            x = arith.addf(load_f32(p["g_raw"], offset, spec.input_dtype), bias)
            running = arith.addf(loop.inner_iter_args[0],
                                 arith.mulf(neg_rate_log2e, fastmath.softplus(x)))
            store_from_f32(running, p["gamma2"], offset, "f32")
            scf.yield_([running])
