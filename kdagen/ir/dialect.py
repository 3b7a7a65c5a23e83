"""The ``kda`` MLIR dialect: tile-level ops of chunked gated-delta attention, defined with IRDL.

The dialect is declared by a table (:data:`OPS`) from which IRDL text is generated and loaded
into every context made by :func:`make_context`. IRDL checks op names, operand/result counts,
operand kinds (tile = builtin ranked tensor, memref, index) and required attributes. What IRDL
cannot express is documented here and done differently:

* **Terminators.** IRDL cannot declare the ``Terminator`` trait, so regions of ``kda.scan`` end
  with ``gpu.yield`` (it has no parent constraint and verifies inside any region).
* **Shape rules** (matmul shapes, broadcast dims, equal types of elementwise operands, ...)
  are checked by :func:`verify_kda`, a Python verifier that :func:`parse_module` and
  :func:`verify` run after MLIR's own verifier.

Execution model (what the interpreter implements; docs/MATH.md §1 is the math):

* A program is a ``func.func`` whose arguments are global tensors (builtin memrefs with
  dynamic dims and their storage element type) plus the scalar ``scale``; argument attributes
  ``kda.name`` / ``kda.role`` / ``kda.layout`` name them, function attributes ``kda.*`` record the
  program options.
* Every *tile* value (a ranked tensor such as ``tensor<64x128xf32>``) is implicitly indexed by
  the pair (sequence n, value head hv): the (sequence, value-head) iteration is implicit
  parallelism, mapped to the grid by a later pass. Memref-only ops (``kda.sum_seqs``,
  ``kda.sum_head_groups``) are global: they run after all the tile work before them.
* ``kda.scan`` iterates over the chunks of each sequence (in reverse with ``reverse = true``),
  carrying its block arguments (e.g. the ``[K, V]`` fp32 state) from chunk to chunk.
* Token memrefs are ``[B, T, H, D...]``; a load of chunk ``c`` reads rows
  ``c*C .. c*C+C-1`` of the current sequence (varlen: offsets from ``cu_seqlens``); rows past
  the sequence end read as 0 and are not stored. ``head_map = "grouped"`` reads head
  ``hv // (HV // H)`` (GVA); ``"direct"`` reads head ``hv``.
* State memrefs are ``[N, HV, D...]`` (layout ``state``), or a state pool ``[slots, HV, D...]``
  (layout ``pool``) whose row for sequence n is chosen by a slot table ``[N]`` (layout
  ``slots``, i32/i64) given to ``kda.load_state`` / ``kda.store_state``; a negative slot
  skips the sequence (``kda.slot_valid`` is false: it loads zeros and stores nothing).
"""
from __future__ import annotations

from dataclasses import dataclass

from kdagen._mlir import ir, irdl

__all__ = [
    "OPS",
    "OpSpec",
    "EFFECTS",
    "KINDS",
    "ops_with",
    "KdaVerifyError",
    "make_context",
    "parse_module",
    "verify",
    "verify_kda",
    "print_module",
    "irdl_text",
]

# operand / result kinds -> IRDL constraint
_KINDS = {
    "tile": 'irdl.base "!builtin.tensor"',
    "memref": 'irdl.base "!builtin.memref"',
    "index": 'irdl.is index',
    "f32": 'irdl.is f32',
    "any": 'irdl.any',
}
# attribute kinds -> IRDL constraint
_ATTR_KINDS = {
    "str": 'irdl.base "#builtin.string"',
    "bool": 'irdl.base "#builtin.integer"',
    "int": 'irdl.base "#builtin.integer"',
    "float": 'irdl.base "#builtin.float"',
    "dims": 'irdl.base "#builtin.dense_array"',
}


#: what an op does besides computing its results (the traits every pass and the lowering
#: read through :func:`ops_with`, instead of keeping their own lists of op names)
EFFECTS = {
    "pure": "results from operands and attributes only: may be merged (CSE), removed when "
            "unused (DCE), recomputed",
    "read": "reads global memory (a program argument or a workspace)",
    "write": "writes global memory",
    "global": "reads and writes whole tensors, after all the tile work before it",
    "alloc": "declares a buffer",
    "sync": "orders the producer/consumer pipeline (kda-warp-specialize)",
    "control": "has a region that runs per chunk",
}
#: what kind of computation an op is
KINDS = {
    "control": "structure: kda.scan",
    "memory": "moves tiles between global memory and registers",
    "source": "makes a tile from no tile (a constant, a scalar argument, a row mask)",
    "elementwise": "each result element from the operands' elements at the same index",
    "shape": "moves elements (broadcast, transpose, rows)",
    "reduction": "sums over a dimension, the chunks, or the heads / sequences",
    "matrix": "matrix products",
    "solve": "unit lower-triangular inverse and solve",
    "pipeline": "ring-buffer synchronisation of the producer/consumer roles",
    "layout": "changes how a tile is spread over threads and memory, not its values "
              "(kda-assign-layouts)",
}


@dataclass(frozen=True)
class OpSpec:
    """One kda op: operands/results as ``(name, kind)`` (kind ``"...*"`` = variadic,
    ``"...?"`` = optional),
    required attributes as ``(name, kind)``, region names, a one-line doc, its ``effect``
    (:data:`EFFECTS`) and its ``kind`` (:data:`KINDS`)."""

    operands: tuple = ()
    results: tuple = ()
    attrs: tuple = ()
    regions: tuple = ()
    doc: str = ""
    kind: str = "elementwise"
    effect: str = "pure"


def _u(doc, same=True, kind="elementwise"):  # unary tile op (same: operand and result of one type)
    k = "tile@T" if same else "tile"
    return OpSpec(operands=(("x", k),), results=(("res", k),), doc=doc, kind=kind)


def _b(doc, same=True, kind="elementwise"):  # binary tile op
    k = "tile@T" if same else "tile"
    return OpSpec(operands=(("lhs", k), ("rhs", k)), results=(("res", k),), doc=doc, kind=kind)


OPS: dict[str, OpSpec] = {
    # ---- structure and memory -----------------------------------------------------------
    "scan": OpSpec(
        operands=(("init", "any*"),), results=(("final", "any*"),), attrs=(("reverse", "bool"),),
        regions=("body",), kind="control", effect="control",
        doc="Iterate over the chunks of each (sequence, value head); block args (chunk: index, "
            "carried...); gpu.yield gives the next carried values; results are the last ones. "
            "reverse = true runs from the last chunk to the first. IRDL unifies the constraint "
            "variable of a variadic operand list, so all carried values have one type."),
    "load": OpSpec(
        operands=(("src", "memref"), ("chunk", "index")), results=(("tile", "tile"),),
        attrs=(("name", "str"), ("head_map", "str")), kind="memory", effect="read",
        doc="Load the [C, D...] tile of chunk `chunk` from a [B, T, H, D...] token tensor; rows "
            "past the sequence end are 0; head_map 'grouped' reads head hv // (HV // H)."),
    "store": OpSpec(
        operands=(("dst", "memref"), ("chunk", "index"), ("tile", "tile")),
        attrs=(("name", "str"),), kind="memory", effect="write",
        doc="Store a [C, D...] tile to chunk `chunk` of a [B, T, HV, D...] token tensor (head hv); "
            "rows past the sequence end are not stored."),
    "load_head": OpSpec(
        operands=(("src", "memref"),), results=(("tile", "tile"),), attrs=(("name", "str"),),
        kind="memory", effect="read", doc="Load the per-head parameter row src[hv] of an [HV, D...] tensor."),
    "load_state": OpSpec(
        operands=(("src", "memref"), ("slots", "memref?")), results=(("tile", "tile"),),
        attrs=(("name", "str"),), kind="memory", effect="read",
        doc="Load src[n, hv] of an [N, HV, D...] per-(sequence, head) tensor; with `slots` (an "
            "[N] int tensor) src is a state pool [slots, HV, D...] and the row is "
            "src[slots[n], hv], 0 where slots[n] < 0."),
    "store_state": OpSpec(
        operands=(("dst", "memref"), ("tile", "tile"), ("slots", "memref?")),
        attrs=(("name", "str"),), kind="memory", effect="write",
        doc="Store dst[n, hv] of an [N, HV, D...] per-(sequence, head) tensor; with `slots`, "
            "dst[slots[n], hv] of a state pool [slots, HV, D...], nothing where slots[n] < 0."),
    "slot_valid": OpSpec(
        operands=(("slots", "memref"),), results=(("valid", "tile"),), kind="memory",
        effect="read",
        doc="tensor<i1> (rank 0): whether the sequence's slot slots[n] of an [N] int tensor is "
            ">= 0 (a negative slot skips the sequence)."),
    "load_chunk": OpSpec(
        operands=(("src", "memref"), ("chunk", "index")), results=(("tile", "tile"),),
        attrs=(("name", "str"),), kind="memory", effect="read",
        doc="Load the tile of (sequence, chunk, head) from a per-chunk workspace "
            "[total chunks, HV, D...]."),
    "store_chunk": OpSpec(
        operands=(("dst", "memref"), ("chunk", "index"), ("tile", "tile")), attrs=(("name", "str"),),
        kind="memory", effect="write", doc="Store the tile of (sequence, chunk, head) to a per-chunk workspace."),
    "workspace": OpSpec(
        results=(("buffer", "memref"),), attrs=(("name", "str"), ("layout", "str")), kind="memory", effect="alloc",
        doc="Declare a named workspace buffer between scans/kernels; layout 'chunk' "
            "[total chunks, HV, D...], 'token' [B, T, HV, D...] or 'state' [N, HV, D...]."),
    "sum_chunks": OpSpec(
        operands=(("src", "memref"),), results=(("tile", "tile"),), attrs=(("name", "str"),),
        kind="reduction", effect="read",
        doc="Per (sequence, head): the sum of a per-chunk workspace over the chunks of the "
            "sequence (e.g. per-chunk partial gradients of a per-head value)."),
    "sum_head_groups": OpSpec(
        operands=(("src", "memref"), ("dst", "memref")), attrs=(("name", "str"),), kind="reduction", effect="global",
        doc="Global: dst[b, t, h] = sum of src[b, t, hv] over the value heads hv of q/k head h (GVA)."),
    "sum_seqs": OpSpec(
        operands=(("src", "memref"), ("dst", "memref")), attrs=(("name", "str"),), kind="reduction", effect="global",
        doc="Global: dst[hv, ...] = sum over sequences n of src[n, hv, ...]."),
    "valid_rows": OpSpec(
        operands=(("chunk", "index"),), results=(("mask", "tile"),), kind="source", effect="pure",
        doc="tensor<Cxi1>: which rows of chunk `chunk` lie inside the sequence."),
    "scalar": OpSpec(
        operands=(("x", "f32"),), results=(("res", "tile"),), kind="source", effect="pure",
        doc="A scalar program argument as a rank-0 tile."),
    "constant": OpSpec(
        results=(("res", "tile"),), attrs=(("value", "float"),),
        kind="source", effect="pure",
        doc="A tile filled with one value."),
    # ---- elementwise ---------------------------------------------------------------------
    "add": _b("lhs + rhs"),
    "sub": _b("lhs - rhs"),
    "mul": _b("lhs * rhs"),
    "div": _b("lhs / rhs"),
    "neg": _u("-x"),
    "exp2": _u("2^x"),
    "log2": _u("log2(x)"),
    "sigmoid": _u("1 / (1 + e^-x)"),
    "softplus": _u("log(1 + e^x)"),
    "rsqrt": _u("1 / sqrt(x)"),
    "convert": _u("element type conversion (bf16/fp16 storage <-> fp32 math)", same=False),
    "select": OpSpec(
        operands=(("cond", "tile"), ("lhs", "tile@T"), ("rhs", "tile@T")), results=(("res", "tile@T"),),
        doc="cond ? lhs : rhs (cond an i1 tile of the same shape)"),
    "assume_range": OpSpec(
        operands=(("x", "tile@T"),), results=(("res", "tile@T"),), attrs=(("lo", "float"), ("hi", "float")),
        doc="Identity that declares lo <= x <= hi (a gate's declared output range, for the "
            "exponent-range analysis)."),
    "convert_layout": OpSpec(
        operands=(("x", "tile@T"),), results=(("res", "tile@T"),), attrs=(("to", "str"),),
        kind="layout",
        doc="Identity on values that moves x into the tile layout `to` (kda-assign-layouts: "
            "where a producer's layout is not the one a consumer needs)."),
    "clamp": OpSpec(
        operands=(("x", "tile@T"),), results=(("res", "tile@T"),), attrs=(("lo", "float"), ("hi", "float")),
        doc="min(max(x, lo), hi) elementwise (NaN stays NaN): a gate's enforced range."),
    "in_range": OpSpec(
        operands=(("x", "tile"),), results=(("mask", "tile"),), attrs=(("lo", "float"), ("hi", "float")),
        doc="i1 tile of x's shape: lo <= x <= hi (false for NaN); the clamp's gradient mask."),
    # ---- shape ---------------------------------------------------------------------------
    "broadcast": OpSpec(
        operands=(("x", "tile"),), results=(("res", "tile"),), attrs=(("dims", "dims"),),
        kind="shape", effect="pure",
        doc="Expand x to the result shape; `dims` are the result dims x does not have."),
    "reduce_sum": OpSpec(
        operands=(("x", "tile"),), results=(("res", "tile"),), attrs=(("dims", "dims"),),
        kind="reduction", effect="pure",
        doc="Sum over the dims `dims` (e.g. [1]: row sums of a [C, D] tile; [0]: over tokens)."),
    "cumsum": OpSpec(
        operands=(("x", "tile@T"),), results=(("res", "tile@T"),), attrs=(("reverse", "bool"),),
        kind="reduction", effect="pure",
        doc="Inclusive cumulative sum over rows (dim 0) within the chunk; reverse = suffix sums."),
    "transpose": _u("2-D transpose", same=False, kind="shape"),
    "extract_row": OpSpec(
        operands=(("x", "tile"),), results=(("res", "tile"),), attrs=(("index", "int"),),
        kind="shape", effect="pure",
        doc="Row `index` of a tile (negative counts from the end)."),
    "embed_row": OpSpec(
        operands=(("x", "tile"),), results=(("res", "tile"),), attrs=(("index", "int"),),
        kind="shape", effect="pure",
        doc="A tile of the result shape that is 0 except row `index`, which is x."),
    # ---- matrix --------------------------------------------------------------------------
    "dot": OpSpec(
        operands=(("lhs", "tile"), ("rhs", "tile")), results=(("res", "tile"),),
        attrs=(("transpose_lhs", "bool"), ("transpose_rhs", "bool")),
        kind="matrix", effect="pure",
        doc="Tile matmul op(lhs) @ op(rhs), op = transpose where flagged."),
    "tril": OpSpec(
        operands=(("x", "tile@T"),), results=(("res", "tile@T"),), attrs=(("diagonal", "int"),),
        doc="Keep x[i, j] with j <= i + diagonal, zero elsewhere (diagonal -1: strictly lower)."),
    "tril_inv": _u("(I + strict_tril(x))^-1: inverse of the unit lower-triangular WY/UT matrix",
                   kind="solve"),
    "tril_solve": _b("(I + strict_tril(lhs))^-1 @ rhs: unit lower-triangular solve", same=False,
                     kind="solve"),
    # ---- pipeline structure (introduced by kda-warp-specialize) ---------------------------
    "pipeline_wait": OpSpec(
        operands=(("x", "tile@T"),), results=(("res", "tile@T"),), attrs=(("slot", "int"),),
        kind="pipeline", effect="sync",
        doc="Consumer side of a producer/consumer ring: wait until the producer's bulk copy of x "
            "into ring slot `slot` has landed (mbarrier 'full'); returns x (identity)."),
    "pipeline_release": OpSpec(
        operands=(("x", "tile"),), attrs=(("slot", "int"),), kind="pipeline", effect="sync",
        doc="Consumer side: x's ring slot may be refilled (mbarrier 'empty' arrive); no value."),
    # ---- bounded decay products (introduced by kda-stable-reassociate) --------------------
    "decay_dot": OpSpec(
        operands=(("lhs", "tile"), ("rhs", "tile"), ("gamma_lhs", "tile"), ("gamma_rhs", "tile")),
        results=(("res", "tile"),), attrs=(("diagonal", "int"), ("subblock", "int"),
                                           ("exact_diagonal", "bool")), kind="matrix", effect="pure",
        doc="res[i, j] = sum_d lhs[i, d] rhs[j, d] 2^(gamma_lhs[i, d] - gamma_rhs[j, d]) for "
            "j <= i + diagonal, else 0: the relative-exponent form of "
            "tril(dot(lhs*2^gamma_lhs, (rhs*2^-gamma_rhs)^T)). subblock S > 1: evaluated as "
            "tensor-core products factored through gamma at the first row of each S-row block; "
            "exact_diagonal: only the blocks left of the diagonal are factored (both factors "
            "<= 1 for a decaying gamma), the diagonal S x S blocks take relative exponents."),
    "decay_matmul": OpSpec(
        operands=(("w", "tile"), ("x", "tile"), ("gamma_row", "tile"), ("gamma_col", "tile")),
        results=(("res", "tile"),), attrs=(("diagonal", "int"), ("transpose", "bool"),
                                           ("subblock", "int"), ("exact_diagonal", "bool")),
        kind="matrix", effect="pure",
        doc="E[i, j, d] = 2^(gamma_row[i, d] - gamma_col[j, d]) masked to j <= i + diagonal; "
            "res[i, d] = sum_j w[i, j] x[j, d] E[i, j, d], or with transpose = true "
            "res[j, d] = sum_i w[i, j] x[i, d] E[i, j, d] (the adjoints of decay_dot)."),
}


def ops_with(effect=None, kind=None, operand: str | None = None) -> frozenset[str]:
    """The full names (``kda.load``) of the ops with ``effect`` and ``kind`` (each a name or a
    collection of names; None: any) and, with ``operand``, an operand of that name."""
    def match(value, want):
        return want is None or (value == want if isinstance(want, str) else value in want)
    return frozenset(f"kda.{name}" for name, spec in OPS.items()
                     if match(spec.effect, effect) and match(spec.kind, kind)
                     and (operand is None or any(o[0] == operand for o in spec.operands)))


def _check_traits() -> None:
    for name, spec in OPS.items():
        if spec.effect not in EFFECTS or spec.kind not in KINDS:
            raise ValueError(f"kda.{name}: unknown effect {spec.effect!r} or kind {spec.kind!r}")


_check_traits()


def irdl_text() -> str:
    """The IRDL module that defines the kda dialect (generated from :data:`OPS`).

    Every operand, result and attribute gets its own IRDL constraint variable (IRDL unifies
    uses of one variable), except kinds written ``kind@VAR``, which share variable VAR: the
    operands and result of elementwise ops must have one type.
    """
    lines = ["irdl.dialect @kda {"]
    for name, spec in OPS.items():
        defs, shared, n = [], {}, 0

        def var(kind, table):
            nonlocal n
            base, _, tag = kind.partition("@")
            if tag and tag in shared:
                return shared[tag]
            v = f"%v{n}"
            n += 1
            defs.append(f"    {v} = {table[base]}")
            if tag:
                shared[tag] = v
            return v

        def seg(items):
            out = []
            for nm, kind in items:
                arity = {"*": "variadic ", "?": "optional "}.get(kind[-1], "")
                out.append(f"{nm}: {arity}{var(kind.rstrip('*?'), _KINDS)}")
            return ", ".join(out)

        body = []
        if spec.operands:
            body.append(f"    irdl.operands({seg(spec.operands)})")
        if spec.results:
            body.append(f"    irdl.results({seg(spec.results)})")
        if spec.attrs:
            parts = [f'"{nm}" = {var(k, _ATTR_KINDS)}' for nm, k in spec.attrs]
            body.append(f"    irdl.attributes {{{', '.join(parts)}}}")
        if spec.regions:
            regs = []
            for r in spec.regions:
                defs.append(f"    %r_{r} = irdl.region")
                regs.append(f"{r}: %r_{r}")
            body.append(f"    irdl.regions({', '.join(regs)})")
        lines.append(f"  irdl.operation @{name} {{")
        lines.extend(defs + body)
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


_IRDL_CACHE: dict[int, ir.Module] = {}


def load_dialect(ctx: ir.Context) -> None:
    """Load the kda dialect into ``ctx`` (call once per context)."""
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(irdl_text())
        irdl.load_dialects(m)
    _IRDL_CACHE[id(ctx)] = m  # keep the definitions alive with the context


def make_context() -> ir.Context:
    """A new MLIR context with the kda dialect (and the builtin/func/gpu dialects) loaded."""
    ctx = ir.Context()
    load_dialect(ctx)
    return ctx


class KdaVerifyError(ValueError):
    """A kda module failed verification (MLIR's verifier or the kda shape rules)."""


def parse_module(text: str, context: ir.Context | None = None, *,
                 check_shapes: bool = True) -> ir.Module:
    """Parse MLIR text in a kda context and verify it (MLIR + kda shape rules).

    ``check_shapes=False`` skips the kda shape rules (:func:`verify_kda`), so that malformed
    input reaches the ``verify`` pass (its tests); MLIR's own verifier (IRDL's op
    constraints) always runs, as the bindings verify while parsing.
    Raises :class:`KdaVerifyError` carrying the MLIR diagnostic on failure.
    """
    ctx = context or make_context()
    with ctx, ir.Location.unknown():
        try:
            module = ir.Module.parse(text)
        except Exception as err:  # MLIRError: its str() holds the diagnostics
            raise KdaVerifyError(str(err)) from None
    if check_shapes:
        verify(module)
    return module


def verify(module: ir.Module) -> None:
    """Run MLIR's verifier and :func:`verify_kda`; raise :class:`KdaVerifyError` on failure."""
    try:
        module.operation.verify()
    except Exception as err:
        raise KdaVerifyError(str(err)) from None
    verify_kda(module)


def print_module(module, *, debug_info: bool = False) -> str:
    """MLIR text of a module (or op) with the DSL's value names as SSA names (``%kd``, ``%S``).

    ``debug_info=True`` also prints the locations, so that the names survive a parse.
    """
    op = module.operation if hasattr(module, "operation") else module
    return op.get_asm(use_name_loc_as_prefix=True, enable_debug_info=debug_info,
                      assume_verified=True)


# --------------------------------------------------------------------------------------
# kda shape verifier
# --------------------------------------------------------------------------------------


def _shape(t):
    return tuple(ir.ShapedType(t).shape)


def _etype(t):
    return str(ir.ShapedType(t).element_type)


def _is_tile(t):
    return isinstance(t, ir.RankedTensorType)


def py_attr(a):
    """A Python value for a builtin attribute (bool, int, float, str, list, dict)."""
    a = a.maybe_downcast() if hasattr(a, "maybe_downcast") else a
    if isinstance(a, ir.BoolAttr):
        return a.value
    if isinstance(a, ir.IntegerAttr):
        return a.value
    if isinstance(a, ir.FloatAttr):
        return a.value
    if isinstance(a, ir.StringAttr):
        return a.value
    if isinstance(a, ir.DenseI64ArrayAttr):
        return list(a)
    if isinstance(a, ir.ArrayAttr):
        return [py_attr(x) for x in a]
    if isinstance(a, ir.DictAttr):
        return {na.name: py_attr(na.attr) for na in a}
    if isinstance(a, ir.UnitAttr):
        return True
    return a


def op_attrs(op) -> dict:
    """All attributes of an op as Python values."""
    op = op.operation if hasattr(op, "operation") else op
    return {n: py_attr(op.attributes[n]) for n in _attr_names(op)}


def _attr_names(op):
    return [na.name if hasattr(na, "name") else na for na in op.attributes]


def _attr(op, name):
    return py_attr(op.attributes[name])


def _fail(op, msg):
    raise KdaVerifyError(f"{op.name}: {msg}\n  at: {op.get_asm(assume_verified=True, skip_regions=True).strip()}")


_ELEMENTWISE = {"add", "sub", "mul", "div", "neg", "exp2", "log2", "sigmoid", "softplus",
                "rsqrt", "assume_range", "clamp"}


def _check_op(op):
    name = op.name[len("kda."):]
    ins = [v.type for v in op.operands]
    outs = [v.type for v in op.results]
    if name in _ELEMENTWISE:
        if any(t != outs[0] for t in ins):
            _fail(op, "elementwise operands and result must have one type")
        if not isinstance(ir.ShapedType(outs[0]).element_type, ir.FloatType):
            _fail(op, "elementwise math needs a float element type")
    elif name == "convert":
        if _shape(ins[0]) != _shape(outs[0]):
            _fail(op, "convert keeps the shape")
    elif name == "in_range":
        if _etype(outs[0]) != "i1" or _shape(ins[0]) != _shape(outs[0]):
            _fail(op, "in_range(x) is an i1 tile of x's shape")
        if not isinstance(ir.ShapedType(ins[0]).element_type, ir.FloatType):
            _fail(op, "in_range needs a float operand")
    elif name == "select":
        if _etype(ins[0]) != "i1" or _shape(ins[0]) != _shape(outs[0]) or ins[1] != outs[0] or ins[2] != outs[0]:
            _fail(op, "select(cond: i1 tile, a, b) with a, b, result of one type and cond of that shape")
    elif name in ("broadcast", "reduce_sum"):
        dims = _attr(op, "dims")
        big, small = (outs[0], ins[0]) if name == "broadcast" else (ins[0], outs[0])
        bs = _shape(big)
        if sorted(set(dims)) != list(dims) or any(d < 0 or d >= len(bs) for d in dims):
            _fail(op, f"dims {dims} must be increasing dims of the larger shape {list(bs)}")
        kept = tuple(s for i, s in enumerate(bs) if i not in dims)
        if kept != _shape(small) or _etype(big) != _etype(small):
            _fail(op, f"shape {list(_shape(small))} is not {list(bs)} without dims {dims}")
    elif name == "cumsum":
        if ins[0] != outs[0] or len(_shape(ins[0])) < 1:
            _fail(op, "cumsum keeps the type (rank >= 1)")
    elif name == "transpose":
        s = _shape(ins[0])
        if len(s) != 2 or _shape(outs[0]) != (s[1], s[0]):
            _fail(op, "transpose of a 2-D tile")
    elif name in ("extract_row", "embed_row"):
        big, small = (ins[0], outs[0]) if name == "extract_row" else (outs[0], ins[0])
        bs = _shape(big)
        idx = _attr(op, "index")
        if not bs or _shape(small) != bs[1:] or not (-bs[0] <= idx < bs[0]):
            _fail(op, f"row {idx} of {list(bs)} has shape {list(bs[1:])}")
    elif name == "dot":
        a, b = _shape(ins[0]), _shape(ins[1])
        if len(a) != 2 or len(b) != 2:
            _fail(op, "dot of 2-D tiles")
        if _attr(op, "transpose_lhs"):
            a = (a[1], a[0])
        if _attr(op, "transpose_rhs"):
            b = (b[1], b[0])
        if a[1] != b[0] or _shape(outs[0]) != (a[0], b[1]):
            _fail(op, f"dot shapes {list(a)} @ {list(b)} -> {list(_shape(outs[0]))}")
    elif name in ("tril", "tril_inv"):
        s = _shape(ins[0])
        if len(s) != 2 or ins[0] != outs[0] or (name == "tril_inv" and s[0] != s[1]):
            _fail(op, "tril/tril_inv take a 2-D (square for tril_inv) tile and keep its type")
    elif name == "tril_solve":
        a, b = _shape(ins[0]), _shape(ins[1])
        if len(a) != 2 or a[0] != a[1] or b[0] != a[0] or ins[1] != outs[0]:
            _fail(op, "tril_solve(L [C, C], B [C, D]) -> [C, D]")
    elif name == "decay_dot":
        a, b, ga, gb = (_shape(t) for t in ins)
        if len(a) != 2 or a != ga or b != gb or a[1] != b[1] or _shape(outs[0]) != (a[0], b[0]):
            _fail(op, "decay_dot(lhs [M, D], rhs [N, D], gamma_lhs [M, D], gamma_rhs [N, D]) -> [M, N]")
    elif name == "decay_matmul":
        w, x, gr, gc = (_shape(t) for t in ins)
        rows, cols = (w[1], w[0]) if _attr(op, "transpose") else (w[0], w[1])
        if (len(w) != 2 or len(x) != 2 or x[0] != (w[0] if _attr(op, "transpose") else w[1])
                or _shape(outs[0]) != (rows, x[1]) or gr != (w[0], x[1]) or gc != (w[1], x[1])):
            _fail(op, "decay_matmul(w [M, N], x, gamma_row [M, D], gamma_col [N, D]): x is "
                      "[N, D] -> [M, D], or with transpose x is [M, D] -> [N, D]")
    elif name == "scan":
        block = op.regions[0].blocks[0]
        args = list(block.arguments)
        if len(args) != len(ins) + 1 or str(args[0].type) != "index":
            _fail(op, "scan body takes (chunk: index, carried...)")
        if [a.type for a in args[1:]] != ins or outs != ins:
            _fail(op, "scan carried types: init, block args and results must match")
        term = list(block.operations)[-1]
        if term.name != "gpu.yield" or [v.type for v in term.operands] != ins:
            _fail(op, "scan body must end with gpu.yield of the carried types")
    elif name == "sum_chunks":
        if tuple(_shape(ins[0])[2:]) != _shape(outs[0]) or _etype(ins[0]) != _etype(outs[0]):
            _fail(op, f"tile {outs[0]} does not match the chunk workspace {ins[0]}")
    elif name in ("load", "load_chunk"):
        mem = _value_part(op, _shape(ins[0]))
        tile = _shape(outs[0])
        lead, rows = (3, 1) if name == "load" else (2, 0)
        if tuple(mem[lead:]) != tuple(tile[rows:]) or _etype(ins[0]) != _etype(outs[0]):
            _fail(op, f"tile {list(tile)} does not match memref trailing dims {list(mem[lead:])}")
        if name == "load" and _attr(op, "head_map") not in ("direct", "grouped"):
            _fail(op, "head_map must be 'direct' or 'grouped'")
    elif name in ("store", "store_chunk"):
        mem = _value_part(op, _shape(ins[0]))
        tile = _shape(ins[2])
        lead, rows = (3, 1) if name == "store" else (2, 0)
        if tuple(mem[lead:]) != tuple(tile[rows:]) or _etype(ins[0]) != _etype(ins[2]):
            _fail(op, f"tile {ins[2]} does not match memref {ins[0]}")
    elif name in ("load_head", "load_state", "store_state"):
        mem = ins[0]
        tile = outs[0] if name != "store_state" else ins[1]
        lead = 1 if name == "load_head" else 2
        if (tuple(_value_part(op, _shape(mem))[lead:]) != _shape(tile)
                or _etype(mem) != _etype(tile)):
            _fail(op, f"tile {tile} does not match memref {mem}")
        slots = ins[1:] if name == "load_state" else ins[2:]
        if slots:
            _check_slots(op, slots[0])
    elif name == "slot_valid":
        _check_slots(op, ins[0])
        if _etype(outs[0]) != "i1" or _shape(outs[0]):
            _fail(op, "slot_valid gives tensor<i1> (rank 0)")
    elif name == "workspace":
        if _attr(op, "layout") not in ("chunk", "token", "state"):
            _fail(op, "layout must be 'chunk', 'token' or 'state'")
    elif name == "valid_rows":
        if _etype(outs[0]) != "i1" or len(_shape(outs[0])) != 1:
            _fail(op, "valid_rows gives tensor<Cxi1>")


def value_part_shape(mem_shape, parts: int, axis: int = -1) -> tuple:
    """A memref shape as one of ``parts`` parts of its value dim sees it (a memory op's
    value_parts): the last dim, or ``axis`` (the memory op's value_axis, negative: -2 for a
    state stored value-first, [V, K]); ValueError where they do not divide it."""
    if parts <= 1:
        return tuple(mem_shape)
    if axis not in (-1, -2) or len(mem_shape) < -axis:
        raise ValueError(f"value_axis = {axis}: expected -1 or -2 of a memref of rank "
                         f"{len(mem_shape)}")
    if mem_shape[axis] % parts:
        raise ValueError(f"value_parts = {parts} does not divide dim {axis} of "
                         f"{list(mem_shape)}")
    shape = list(mem_shape)
    shape[axis] //= parts
    return tuple(shape)


def _value_part(op, mem_shape: tuple) -> tuple:
    names = _attr_names(op)
    parts = int(_attr(op, "value_parts")) if "value_parts" in names else 1
    axis = int(_attr(op, "value_axis")) if "value_axis" in names else -1
    try:
        return value_part_shape(mem_shape, parts, axis)
    except ValueError as err:
        _fail(op, str(err))


def _check_slots(op, t) -> None:
    """A slot table: an [N] memref of i32 or i64 (one state-pool row per sequence)."""
    if len(_shape(t)) != 1 or _etype(t) not in ("i32", "i64"):
        _fail(op, f"slots must be an [N] memref of i32 or i64, got {t}")


def verify_kda(module) -> None:
    """Check the kda shape rules that IRDL cannot express; raise :class:`KdaVerifyError`."""
    root = module.operation if hasattr(module, "operation") else module

    def visit(op):
        op = op.operation
        if op.name.startswith("kda."):
            _check_op(op)
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner)

    visit(root)
