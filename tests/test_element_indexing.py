"""The element loops' indices (kdagen.codegen.lower.tiles): a thread's elements share its inner
index, so the loop body holds no division chain per element (each address is the thread's
variable part plus an immediate); the indices equal the plain unravel of each flat element."""
import itertools

import pytest

from kdagen.codegen.lower import tiles as T_


@pytest.mark.parametrize("shape,stride,count", [((64, 128), 256, 4), ((64, 128), 512, 8),
                                                ((64, 64), 128, 4), ((3, 50), 128, 1),
                                                ((96, 16), 128, 3), ((7,), 2, 3),
                                                ((4, 8, 16), 128, 4), ((64, 128), 96, 4)])
def test_strided_indices_equal_the_unravel_of_each_element(shape, stride, count):
    n = T_.numel(shape)
    for base in range(0, n):
        if base + (count - 1) * stride >= n:
            continue
        got = T_.strided_indices(base, shape, stride, count)
        want = [T_.unravel(base + k * stride, shape) for k in range(count)]
        assert got == want, (base, got, want)


def test_unravel_covers_every_index_once():
    shape = (3, 5, 4)
    got = [tuple(T_.unravel(e, shape)) for e in range(T_.numel(shape))]
    assert got == list(itertools.product(*map(range, shape)))


def _smem_kernel_text(nthreads: int, emit) -> str:
    """The MLIR of a kernel of ``nthreads`` threads whose body is ``emit(tid, smem)`` (the
    thread index as an int-like, the dynamic shared memory's base), emitted with the MLIR
    backend."""
    pytest.importorskip("numba_cuda_mlir")
    from kdagen.codegen.common.ints import IntVal
    from kdagen.codegen.common.kernel import GpuModuleBuilder, Param
    from kdagen.codegen.common import smem as smem_mod
    from kdagen.codegen.common.sreg import thread_idx
    from kdagen.codegen.lower import backend as B
    from kdagen.codegen.lower.mlir_backend import MlirBackend
    from kdagen._mlir import llvm

    b = GpuModuleBuilder("k")
    with b.kernel("k", [Param("x", "ptr", "f32")], (nthreads, 1, 1)):
        smem_mod.declare_dynamic_smem(b)
        sm = llvm.mlir_addressof(smem_mod.shared_ptr_type(), smem_mod.DYNAMIC_SMEM_SYMBOL)
        with B.use(MlirBackend()):
            emit(IntVal(thread_idx("x")), sm)
    b.verify()
    return str(b.module)


@pytest.mark.parametrize("nthreads,batch", [(128, 4), (256, 4), (512, 2)])
def test_element_loop_derives_the_index_once_per_batch(nthreads, batch):
    """materialize of a [64, 128] tile: each loop iteration splits its first element's flat
    index into row and column once (one shift, one mask); the batch's other elements are that
    row plus a constant (the plain unravel re-derived row and column of every element). A thread
    takes 4 consecutive elements at a time (tiles.VEC): one 16-byte load and store each, and
    ``batch`` elements in flight means batch // 4 such groups (at least one)."""
    def emit(tid, sm):
        th = T_.Threads(tid, nthreads, batch)
        src = T_.BufRef(T_.Scratch(sm, "smem"), 0, (64, 128), (128, 1))
        dst = T_.BufRef(T_.Scratch(sm, "smem"), 64 * 128, (64, 128), (128, 1))
        T_.materialize(th, T_.binary("mul", src, T_.ConstRef(2.0, (64, 128))), dst)
    text = _smem_kernel_text(nthreads, emit)
    body = text[text.index("scf.for"):]
    assert body.count("arith.shrui") == 1 and body.count("arith.andi") == 1
    assert "arith.divui" not in body and "arith.remui" not in body
    groups = max(1, batch // T_.VEC)
    assert body.count("llvm.load") == groups
    assert body.count("!llvm.ptr<3> -> vector<4xf32>") == groups      # 16-byte loads
    assert body.count("llvm.store") == groups
    assert body.count(": vector<4xf32>, !llvm.ptr<3>") == groups       # 16-byte stores


@pytest.mark.parametrize("S", [8, 16, 32, 64])
def test_block_start_from_the_atom_row_equals_the_row_division(S):
    """The decay products' reference row (the first row of an S-row block) taken once per
    16-row mma atom equals the per-element division for every row of the atom."""
    for rb in range(0, 128, 16):
        for i in range(rb, rb + 16):
            assert T_._atom_block_start(i, rb, S) == (i // S) * S, (rb, i, S)


class _Affine:
    """An int with IntVal's split_const (variable part, constant), for layout arithmetic."""

    def __init__(self, value, const=0):
        self.value, self.const = value, const

    def split_const(self):
        return _Affine(self.value - self.const), self.const

    def _v(self, x):
        return x.value if isinstance(x, _Affine) else x

    def __add__(self, x): return self.value + self._v(x)
    __radd__ = __add__
    def __mul__(self, x): return self.value * self._v(x)
    __rmul__ = __mul__
    def __floordiv__(self, x): return self.value // self._v(x)
    def __mod__(self, x): return self.value % self._v(x)
    def __rshift__(self, x): return self.value >> self._v(x)
    def __and__(self, x): return self.value & self._v(x)
    def __xor__(self, x): return self.value ^ self._v(x)


@pytest.mark.parametrize("swizzle,elem_bytes", [(128, 2), (128, 4), (64, 2), (32, 4), (0, 4)])
def test_swizzled_offset_takes_whole_periods_of_rows_as_an_immediate(swizzle, elem_bytes):
    """SmemLayout.byte_offset of a row with a constant part that is a multiple of 8 (the
    swizzle's period) splits it off as a plain byte offset: the same address as the row's
    full value for every element."""
    from kdagen.codegen.common.layouts import SmemLayout
    cols = 2 * max(swizzle, 16) // elem_bytes
    lay = SmemLayout(64, cols, elem_bytes, swizzle)
    for row in range(64):
        for const in (0, 8, 16, 24, 3):
            if const > row:
                continue
            for col in range(cols):
                assert lay.byte_offset(_Affine(row, const), col) == lay.byte_offset(row, col)


@pytest.mark.parametrize("rows,ks,along_k", [(64, 32, False), (128, 32, False), (64, 64, False),
                                             (64, 32, True), (12, 32, False)])
def test_wgmma_staging_covers_every_pair_once(rows, ks, along_k):
    from kdagen.codegen.lower.sm90_native import staging_order
    shape, rc = staging_order(rows, ks, along_k)
    got = [rc(T_.unravel(e, shape)) for e in range(T_.numel(shape))]
    assert sorted(got) == [(r, c) for r in range(rows) for c in range(ks // 2)]
    if not along_k and rows % 8 == 0:
        # a warp: 8 consecutive rows x 4 consecutive pairs
        warp = {rc(T_.unravel(e, shape)) for e in range(32)}
        assert warp == {(r, c) for r in range(8) for c in range(4)}


def test_vector_reads_only_where_consecutive_and_aligned():
    """A buffer's 4 consecutive elements are one 16-byte access only where they are
    consecutive in memory and the first is 4-element aligned (its offset and every outer stride
    a multiple of 4); a broadcast along the last dim reads one element for all four."""
    scratch = T_.Scratch(None, "smem")
    assert T_.BufRef(scratch, 0, (64, 128), (132, 1)).vector_ok(4)
    assert not T_.BufRef(scratch, 2, (64, 128), (132, 1)).vector_ok(4)     # offset
    assert not T_.BufRef(scratch, 0, (64, 128), (129, 1)).vector_ok(4)     # odd row pitch
    assert not T_.BufRef(scratch, 0, (64, 128), (1, 132)).vector_ok(4)     # transposed view
    reads = []
    bcast = T_.BufRef(scratch, 0, (64, 128), (1, 0))
    bcast.read = lambda idx: reads.append(list(idx)) or len(reads)
    assert T_.read_vec(bcast, [5, 8], 4) == [1, 1, 1, 1] and reads == [[5, 8]]


def test_memref_vector_access_rules():
    """Workspace and argument rows take vector accesses only in their stored order (not
    transposed, not split into bf16 hi/lo tiles), with rows a multiple of the width, and, for
    a value part's columns, a part width that keeps the first column aligned."""
    from kdagen.codegen.lower.emitter import MemRef
    base = MemRef("x", None, "f32", "chunk", None, (64, 128))
    assert base.vector_ok(4)
    assert not MemRef("x", None, "f32", "chunk", None, (64, 128), transposed=True).vector_ok(4)
    assert not MemRef("x", None, "f32", "chunk", None, (64, 128), split="bf16_hi_lo").vector_ok(4)
    assert not MemRef("x", None, "f32", "chunk", None, (64, 126)).vector_ok(4)
    part = object()                       # a run-time column offset (the part index times 64)
    assert MemRef("x", None, "f32", "chunk", None, (64, 128), col0=part, col_step=64).vector_ok(4)
    assert not MemRef("x", None, "f32", "chunk", None, (64, 128), col0=part,
                      col_step=2).vector_ok(4)
    assert not MemRef("x", None, "f32", "chunk", None, (64, 128), col0=part).vector_ok(4)


def test_simulator_rejects_a_misaligned_vector_access():
    """The CPU simulator faults a vector access whose first element is not a multiple of its
    width, as the GPU would (misaligned address)."""
    import numpy as np
    from kdagen.codegen.lower.sim_backend import SimBackend, SimError, SimMemory, SimPtr
    sim = SimBackend(32)
    mem = SimPtr(SimMemory("buf", np.zeros(256, np.float32), "f32"))
    with pytest.raises(SimError, match="misaligned"):
        sim.load_vec(mem, np.arange(32) * 4 + 2, 4)
    assert len(sim.load_vec(mem, np.arange(32) * 4, 4)) == 4


@pytest.mark.parametrize("dims,vector", [([1], True), ([0, 1], True), ([0], False)])
def test_reductions_along_rows_read_four_elements_at_once(dims, vector):
    """A reduction over the last dim of a [64, 128] buffer folds groups of 4 consecutive
    elements, each one 16-byte shared load (the few-output form too: [64, 128] -> []); one
    down the columns ([0]) keeps a lane per output and reads element by element."""
    def emit(tid, sm):
        th = T_.Threads(tid, 512, 2, ordered=True)
        src = T_.BufRef(T_.Scratch(sm, "smem"), 0, (64, 128), (132, 1))
        out_shape = tuple(s for d, s in enumerate((64, 128)) if d not in dims)
        out = T_.BufRef(T_.Scratch(sm, "smem"), 64 * 132, out_shape, (1,) if out_shape else ())
        red = T_.ReduceScratch(T_.BufRef(T_.Scratch(sm, "smem"), 64 * 132 + 128, (16,), (1,)))
        T_.emit_reduce_sum(th, out, src, dims, red)
    text = _smem_kernel_text(512, emit)
    assert ("!llvm.ptr<3> -> vector<4xf32>" in text) == vector


def _materialize_text(vec_loops: str, src_of) -> str:
    """The MLIR of materialising ``src_of(buffer)`` into a second [64, 128] shared buffer
    (pitch 132) on 256 threads under ``vec_loops``."""
    def emit(tid, sm):
        th = T_.Threads(tid, 256, 8, vec_loops=vec_loops)
        src = T_.BufRef(T_.Scratch(sm, "smem"), 0, (128, 132), (132, 1))
        dst = T_.BufRef(T_.Scratch(sm, "smem"), 128 * 132, (64, 128), (132, 1))
        T_.materialize(th, src_of(src), dst)
    return _smem_kernel_text(256, emit)


@pytest.mark.parametrize("vec_loops,plain,transposed", [
    ("all", True, True), ("dst", True, True), ("capable", True, False), ("off", False, False)])
def test_vector_loops_option(vec_loops, plain, transposed):
    """LowerOptions.vector_loops: "all" and "dst" group any loop whose destination takes vector
    stores; "capable" only where every read of the source is a vector access too (a
    transposed operand's reads are not); "off" never."""
    pytest.importorskip("numba_cuda_mlir")
    def rows(src):
        return T_.binary("mul", T_.BufRef(src.scratch, 0, (64, 128), (132, 1)),
                         T_.ConstRef(2.0, (64, 128)))

    def columns(src):          # [64, 128] read down the columns of a [128, 64] view
        return T_.unary("neg", T_.transpose(T_.BufRef(src.scratch, 0, (128, 64), (132, 1))), {})
    store4 = ": vector<4xf32>, !llvm.ptr<3>"
    assert (store4 in _materialize_text(vec_loops, rows)) == plain
    assert (store4 in _materialize_text(vec_loops, columns)) == transposed


def test_vector_loops_option_is_checked():
    from kdagen.codegen.lower.kernel import LowerOptions, prepare
    from kdagen.codegen.lower.plan import LoweringError
    with pytest.raises(LoweringError, match="vector_loops"):
        prepare(None, None, "k", LowerOptions(vector_loops="some"))
