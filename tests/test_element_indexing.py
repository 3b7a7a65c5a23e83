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


@pytest.mark.parametrize("nthreads,batch", [(128, 4), (256, 4), (512, 2)])
def test_element_loop_derives_the_index_once_per_batch(nthreads, batch):
    """materialize of a [64, 128] tile: each loop iteration splits its first element's flat
    index into row and column once (one shift, one mask); the batch's other elements are that
    row plus a constant (the plain unravel re-derived row and column of every element)."""
    pytest.importorskip("numba_cuda_mlir")
    from kdagen.codegen.common.ints import IntVal
    from kdagen.codegen.common.kernel import GpuModuleBuilder, Param
    from kdagen.codegen.common import smem as smem_mod
    from kdagen.codegen.common.sreg import thread_idx
    from kdagen.codegen.lower import backend as B
    from kdagen.codegen.lower.mlir_backend import MlirBackend
    from kdagen._mlir import llvm

    b = GpuModuleBuilder("mat")
    with b.kernel("mat", [Param("x", "ptr", "f32")], (nthreads, 1, 1)):
        smem_mod.declare_dynamic_smem(b)
        sm = llvm.mlir_addressof(smem_mod.shared_ptr_type(), smem_mod.DYNAMIC_SMEM_SYMBOL)
        with B.use(MlirBackend()):
            th = T_.Threads(IntVal(thread_idx("x")), nthreads, batch)
            src = T_.BufRef(T_.Scratch(sm, "smem"), 0, (64, 128), (128, 1))
            dst = T_.BufRef(T_.Scratch(sm, "smem"), 64 * 128, (64, 128), (128, 1))
            T_.materialize(th, T_.FnRef((64, 128), lambda idx: B.mul(src.read(idx), B.f(2.0))),
                           dst)
    b.verify()
    text = str(b.module)
    body = text[text.index("scf.for"):]
    assert body.count("arith.shrui") == 1 and body.count("arith.andi") == 1
    assert "arith.divui" not in body and "arith.remui" not in body
    assert body.count("llvm.load") == batch


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
