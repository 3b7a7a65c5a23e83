"""The MLIR backend of the lowering's primitives (backend.py): emits ``arith`` / ``llvm`` /
``scf`` / ``nvvm`` ops at the current insertion point; i64 int-likes are :class:`W64`.

Given a :class:`~kdagen.codegen.lower.cost.CostCounter` (``cost=``), it also tells the counter
what it emits (loads/stores by memory space, barriers, special functions, loops with their
static trip counts); the counter only counts, the emitted IR is the same without it."""
from __future__ import annotations

__all__ = ["MlirBackend", "W64"]


class W64:
    """An i64 SSA value with + - * (signed) for address arithmetic."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    @staticmethod
    def _v(x):
        from kdagen._mlir import arith, ir
        if isinstance(x, W64):
            return x.value
        if isinstance(x, int):
            return arith.constant(ir.IntegerType.get_signless(64), x)
        return MlirBackend._i64(x)

    def _bin(self, other, fn, rev=False):
        a, b = self.value, W64._v(other)
        return W64(fn(b, a) if rev else fn(a, b))

    def __add__(self, o):
        from kdagen._mlir import arith
        if isinstance(o, int) and o == 0:
            return self
        return self._bin(o, arith.addi)

    __radd__ = __add__

    def __sub__(self, o):
        from kdagen._mlir import arith
        return self._bin(o, arith.subi)

    def __rsub__(self, o):
        from kdagen._mlir import arith
        return self._bin(o, arith.subi, rev=True)

    def __mul__(self, o):
        from kdagen._mlir import arith
        if isinstance(o, int) and o == 1:
            return self
        return self._bin(o, arith.muli)

    __rmul__ = __mul__


class MlirBackend:
    name = "mlir"

    def __init__(self, barrier: tuple[int, int] | None = None, cost=None):
        """``barrier``: (named barrier id, thread count) that `barrier()` synchronises on, for
        kernels whose tile code runs in one warpgroup of several (None: the whole CTA).
        ``cost``: a :class:`~kdagen.codegen.lower.cost.CostCounter` to feed (None: none)."""
        from kdagen._mlir import arith, ir, llvm, nvvm, scf
        from kdagen.codegen.common import ints
        from .cost import NullCounter
        self.arith, self.ir, self.llvm, self.nvvm, self.scf, self.ints = arith, ir, llvm, nvvm, scf, ints
        self.named_barrier = barrier
        self.cost = cost if cost is not None else NullCounter()
        self._spaces: dict = {}

    def _space(self, ptr) -> str:
        """"shared" for an address-space-3 pointer, else "global"."""
        key = str(ptr.type)
        space = self._spaces.get(key)
        if space is None:
            space = self._spaces[key] = "shared" if key.endswith("<3>") else "global"
        return space

    # types
    def f32(self):
        return self.ir.F32Type.get()

    def i32(self):
        return self.ir.IntegerType.get_signless(32)

    @staticmethod
    def _i64(x):
        from kdagen._mlir import arith, ir
        from kdagen.codegen.common.ints import IntVal, as_i32
        i64 = ir.IntegerType.get_signless(64)
        if isinstance(x, W64):
            return x.value
        if isinstance(x, int):
            return arith.constant(i64, x)
        v = x.value if isinstance(x, IntVal) else x
        if isinstance(v.type, ir.IndexType):
            return arith.index_cast(i64, v)
        if ir.IntegerType(v.type).width == 64:
            return v
        return arith.extsi(i64, as_i32(v))

    # float
    def const_f(self, x):
        return self.arith.constant(self.f32(), x)

    def add(self, a, b):
        self.cost.event("alu.f32")
        return self.arith.addf(a, b)

    def sub(self, a, b):
        self.cost.event("alu.f32")
        return self.arith.subf(a, b)

    def mul(self, a, b):
        self.cost.event("alu.f32")
        return self.arith.mulf(a, b)

    def div(self, a, b):
        self.cost.event("div")
        return self.arith.divf(a, b)

    def neg(self, a):
        self.cost.event("alu.f32")
        return self.arith.negf(a)

    def maxf(self, a, b):
        self.cost.event("alu.f32")
        return self.arith.maximumf(a, b)

    def minf(self, a, b):
        self.cost.event("alu.f32")
        return self.arith.minimumf(a, b)

    def fma(self, a, b, c):
        self.cost.event("fma")
        return self.llvm.intr_fma(a, b, c)

    def ex2(self, a):
        self.cost.event("ex2")
        return self.nvvm.ex2(a)

    def lg2(self, a):
        self.cost.event("lg2")
        return self.nvvm.log2(a)

    def rcp(self, a):
        self.cost.event("rcp")
        return self.nvvm.rcp_approx_ftz_f(a)

    def sqrt(self, a):
        self.cost.event("sqrt")
        return self.llvm.inline_asm(self.f32(), [a], "sqrt.rn.f32 $0, $1;", "=f,f")

    def rsqrt_approx(self, a):
        self.cost.event("rsqrt")
        return self.llvm.inline_asm(self.f32(), [a], "rsqrt.approx.ftz.f32 $0, $1;", "=f,f")

    def sel(self, cond, a, b):
        return self.arith.select(cond, a, b)

    def nonzero(self, x):
        return self.arith.cmpf(self.arith.CmpFPredicate.UNE, x, self.const_f(0.0))

    def fle(self, a, b):
        return self.arith.cmpf(self.arith.CmpFPredicate.OLE, a, b)

    def round_to(self, x, elt):
        if elt == "tf32":
            from kdagen.codegen.common.convert import round_tf32
            return round_tf32(x)
        t = {"bf16": self.ir.BF16Type.get(), "f16": self.ir.F16Type.get()}[elt]
        return self.arith.extf(self.f32(), self.arith.truncf(t, x))

    # ints
    def icmp(self, pred, a, b):
        P = self.arith.CmpIPredicate
        p = {"lt": P.slt, "le": P.sle, "eq": P.eq, "ne": P.ne, "ge": P.sge, "gt": P.sgt}[pred]
        if isinstance(a, W64) or isinstance(b, W64):
            return self.arith.cmpi(p, self._i64(a), self._i64(b))
        return self.arith.cmpi(p, self.ints.as_i32(a), self.ints.as_i32(b))

    def isel(self, cond, a, b):
        if isinstance(a, W64) or isinstance(b, W64):
            return W64(self.arith.select(cond, self._i64(a), self._i64(b)))
        return self.ints.IntVal(self.arith.select(cond, self.ints.as_i32(a), self.ints.as_i32(b)))

    def band(self, a, b):
        return self.arith.andi(a, b)

    def wide(self, x):
        if isinstance(x, int):
            return x
        return W64(self._i64(x))

    def narrow(self, x):
        if isinstance(x, int):
            return x
        return self.ints.IntVal(self.arith.trunci(self.i32(), self._i64(x)))

    # control
    def for_range(self, lo, hi, step, body, iter_args, trips=None):
        ir, arith, scf, ints = self.ir, self.arith, self.scf, self.ints
        if trips is None and all(isinstance(x, int) for x in (lo, hi, step)):
            trips = max(0, -(-(hi - lo) // step))

        def idx(x):
            return arith.index_cast(ir.IndexType.get(), ints.as_i32(x))
        def raw(v):
            if isinstance(v, (ints.IntVal, W64)):
                return v.value
            if isinstance(v, int):
                return ints.as_i32(v)
            return v

        def wrap(v):
            if isinstance(v.type, ir.IntegerType) and ir.IntegerType(v.type).width == 32:
                return ints.IntVal(v)
            if isinstance(v.type, ir.IntegerType) and ir.IntegerType(v.type).width == 64:
                return W64(v)
            return v

        loop = scf.ForOp(idx(lo), idx(hi), idx(step), [raw(v) for v in iter_args])
        if trips is not None:       # for tools that weigh the emitted ops (tools/emitted_ops.py)
            loop.operation.attributes["kda.trips"] = ir.StringAttr.get(str(trips))
        with ir.InsertionPoint(loop.body), self.cost.loop(trips, getattr(body, "__qualname__", "loop")):
            out = body(ints.IntVal(loop.induction_variable), *[wrap(v) for v in loop.inner_iter_args])
            scf.yield_([raw(v) for v in (out or [])])
        return [wrap(v) for v in loop.results] if iter_args else []

    def if_then(self, cond, body, cold=False):
        if isinstance(cond, bool):
            if cond:
                body()
            return
        branch = self.scf.IfOp(cond)
        if cold:                    # expected not to run (tools/emitted_ops.py weighs it 0)
            branch.operation.attributes["kda.cold"] = self.ir.UnitAttr.get()
        with self.ir.InsertionPoint(branch.then_block):
            if cold:
                with self.cost.cold():
                    body()
            else:
                body()
            self.scf.yield_([])

    def barrier(self):
        self.cost.barrier()
        if self.named_barrier is None:
            self.nvvm.barrier()
        else:
            from kdagen.codegen.common.barrier import named_barrier_sync
            named_barrier_sync(*self.named_barrier)

    def barrier_count(self, flag):
        self.cost.barrier()
        from kdagen.codegen.common.barrier import barrier_popc
        barrier_id, threads = self.named_barrier if self.named_barrier else (0, None)
        return self.ints.IntVal(barrier_popc(self.ints.as_i32(flag), barrier_id, threads))

    def uniform(self, x):
        return x

    def shfl_xor(self, x, mask):
        self.cost.event("shfl")
        from kdagen.codegen.common.shuffle import shfl_xor
        return shfl_xor(x, mask)

    def op_scope(self, label: str):
        return self.ir.Location.name(label)

    def fresh_tid(self):
        v = self.llvm.inline_asm(self.i32(), [], "mov.u32 $0, %tid.x;", "=r",
                                 has_side_effects=True)
        return self.ints.IntVal(v)

    def pack_bf16x2(self, lo, hi):
        self.cost.event("cvt.bf16x2")
        from kdagen.codegen.common.convert import pack_f32x2
        return pack_f32x2(lo, hi, "bf16")

    def mma_bf16(self, a, b, c):
        self.cost.event("mma.sync")
        from kdagen.codegen.common.mma import mma_m16n8k16
        return mma_m16n8k16(list(a), list(b), list(c), "bf16")

    def tf32_operand(self, x):
        self.cost.event("cvt.tf32")
        from kdagen.codegen.common.convert import tf32_operand_bits
        return tf32_operand_bits(x)

    def mma_tf32(self, a, b, c):
        self.cost.event("mma.sync")
        from kdagen.codegen.common.mma import mma_m16n8k8_tf32
        return mma_m16n8k8_tf32(list(a), list(b), list(c))

    # memory: ptr is an llvm.ptr value (global or shared); index an int-like (i32) or W64
    def _elem(self, elt):
        ir = self.ir
        return {"bf16": ir.BF16Type.get(), "f16": ir.F16Type.get(), "f32": self.f32(),
                "i32": self.i32(), "i64": ir.IntegerType.get_signless(64)}[elt]

    def gep(self, ptr, index, elt="f32"):
        if isinstance(index, int) and index == 0:
            return ptr
        if isinstance(index, self.ints.IntVal):
            # the variable part as one pointer (shared by every element of a fragment), the
            # constant as an immediate offset: no per-element index sum for LLVM to reduce
            var, const = index.split_const()
            if const:
                base = self.gep(ptr, var, elt)
                return self.llvm.getelementptr(ptr.type, base, [], [const], self._elem(elt), 0)
        if isinstance(index, W64):
            iv = index.value
        elif isinstance(index, int) and not (-2**31 <= index < 2**31):
            iv = self._i64(index)
        else:
            iv = self.ints.as_i32(index)
        return self.llvm.getelementptr(ptr.type, ptr, [iv], [-2147483648], self._elem(elt), 0)

    def load(self, ptr, index, elt="f32"):
        self.cost.load(self._space(ptr), nbytes=self._ELT_BYTES[elt])
        v = self.llvm.load(self._elem(elt), self.gep(ptr, index, elt))
        if elt in ("bf16", "f16"):
            return self.arith.extf(self.f32(), v)
        return v

    _ELT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i64": 8}

    def load_vec(self, ptr, index, n, elt="f32"):
        self.cost.load(self._space(ptr), nbytes=n * self._ELT_BYTES[elt])
        vt = self.ir.VectorType.get([n], self._elem(elt))
        v = self.llvm.load(vt, self.gep(ptr, index, elt), alignment=n * self._ELT_BYTES[elt])
        out = [self.llvm.extractelement(v, self.ints.as_i32(k)) for k in range(n)]
        if elt in ("bf16", "f16"):
            out = [self.arith.extf(self.f32(), x) for x in out]
        return out

    def store_vec(self, ptr, index, values, elt="f32"):
        self.cost.store(self._space(ptr), nbytes=len(values) * self._ELT_BYTES[elt])
        n = len(values)
        if elt in ("bf16", "f16"):
            values = [self.arith.truncf(self._elem(elt), x) for x in values]
        vt = self.ir.VectorType.get([n], self._elem(elt))
        v = self.llvm.mlir_undef(vt)
        for k, x in enumerate(values):
            v = self.llvm.insertelement(v, x, self.ints.as_i32(k))
        self.llvm.store(v, self.gep(ptr, index, elt), alignment=n * self._ELT_BYTES[elt])

    def store(self, ptr, index, value, elt="f32"):
        self.cost.store(self._space(ptr), nbytes=self._ELT_BYTES[elt])
        if elt in ("bf16", "f16"):
            value = self.arith.truncf(self._elem(elt), value)
        self.llvm.store(value, self.gep(ptr, index, elt))
