"""``kda-stable-reassociate``: rewrite every exp2 whose argument is not provably in fp32 range.

Driven by :mod:`kdagen.passes.exponent_range`. Three rules, applied in this order:

1. **Relative exponents.** ``tril(dot(A ⊙ 2^Γ, (B ⊙ 2^−Γ)ᵀ), diagonal ≤ 0)`` — the naive
   factored product of docs/MATH.md §1, where 2^Γ underflows and 2^−Γ overflows — becomes
   ``kda.decay_dot(A, B, Γ, Γ)``: Σ_d A_id B_jd 2^(Γ_id − Γ_jd) for j ≤ i + diagonal. When Γ is
   a row cumsum of non-positive increments (a decaying gate), every exponent is ≤ 0.
   The sub-block size S is chosen from the bound of the increments so that the factoring
   2^(Γ_i − r)·2^(r − Γ_j) through r = Γ at the first row of each S-row block keeps both
   factors in range (so codegen can use tensor-core matmuls per block); S = 1 when even two
   rows could overflow. Then (a steep gate such as softplus) the op keeps blocks of
   ``diagonal_block`` rows with ``exact_diagonal``: the blocks left of the diagonal are factored
   through r = Γ at the first row of the row block — Γ_i ≤ r ≤ Γ_j there, so both factors are
   ≤ 1 for any decaying gate, whatever its steepness — and only the diagonal blocks take the
   elementwise relative exponents (a quarter of the exponentials at C = 64, the rest on tensor
   cores).
2. **Dead code.** The 2^−Γ factors and naive products left unused are removed.
3. **Bounds.** Every remaining ``kda.exp2`` gets ``exp_bound`` (proven bound of |argument|)
   and ``exp_proof`` (how it was proven). A provably non-positive argument that may fall
   below −126 is clamped there (``clamp_min``): the value changes by less than 2^−126, which
   no O(1) result can see, and underflow becomes a proven bound. An argument that may exceed
   +126 is saturated there (``clamp_max``) when its value reaches only the clamp of a gate's
   enforced range through elementwise ops (``-exp(A_log) * f(g_raw)`` with A_log unbounded);
   any other stops the pass with a diagnostic naming the op and the bound that could be proven.

4. **Complements.** ``1 − σ(x)`` becomes ``σ(−x)`` (the sigmoid adjoint's ``y·(1 − y)``
   otherwise loses the whole gradient of a saturated gate in fp32).

The backward programs need no other rules of their own: the pipeline differentiates the rewritten
forward (``kda-autodiff`` after this pass), and the adjoints of ``decay_dot`` are again
bounded decay products (``kda.decay_matmul``), so the catastrophically cancelling gate-gradient
sum of the naive backward, ``dkd·kd − dki·ki − ...``, is produced as
``ln2·(A ⊙ dA − B ⊙ dB)`` with every term O(1).
"""
from __future__ import annotations

from dataclasses import dataclass

from .._mlir import ir
from ..ir.transforms import dce, defining_op, walk
from .base import ModulePass, PassError, register_pass
from .exponent_range import Range, RangeAnalysis

def _chunk(op) -> int:
    """The chunk size of the program ``op`` is in (the within-chunk cumsum spans that many
    tokens), from the module's ``kda.chunk_size``; 64 when not found."""
    o = op
    while o is not None:
        if "kda.chunk_size" in o.attributes:
            return int(ir.IntegerAttr(o.attributes["kda.chunk_size"]).value)
        parent = o.parent
        o = parent.operation if parent is not None and hasattr(parent, "operation") else parent
    return 64


def _bool_attr(op, name: str) -> bool:
    return name in op.attributes and bool(ir.BoolAttr(op.attributes[name]).value)


def _int_attr(op, name: str) -> int:
    return int(ir.IntegerAttr(op.attributes[name]).value)


def _i64(v: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(v))


def _f64(v: float) -> ir.Attribute:
    return ir.FloatAttr.get(ir.F64Type.get(), float(v))


def _exp_scaled(value: ir.Value):
    """``x ⊙ 2^p`` → (x, p); None when ``value`` is not such a product."""
    op = defining_op(value)
    if op is None or op.name != "kda.mul":
        return None
    for i in (0, 1):
        e = defining_op(op.operands[i])
        if e is not None and e.name == "kda.exp2" and "clamp_min" not in e.attributes:
            return op.operands[1 - i], e.operands[0]
    return None


def _negated(value: ir.Value):
    op = defining_op(value)
    return op.operands[0] if op is not None and op.name == "kda.neg" else None


def _fmt(x: float) -> str:
    return f"{x:.4g}"


@register_pass
@dataclass
class StableReassociatePass(ModulePass):
    name = "kda-stable-reassociate"
    summary = "rewrite exp2 of unbounded arguments into bounded forms; prove every exp2 bound"
    max_exponent: float = 126.0      # |argument| of exp2 that fp32 represents as a normal number
    subblock: int = 0                # 0: choose from the bounds; else force this block size
    diagonal_block: int = 16         # block of the exact-diagonal form (0: elementwise instead)

    def run(self, module: ir.Module) -> None:
        from ..ir.derive import derive_backward, forward_module, primal_func, replace_contents
        primal = primal_func(module)
        if primal is None:
            self._rewrite(module)
            return
        # A backward program: rewrite the forward it was derived from, then derive again, so
        # the adjoints are those of the bounded forms (see the module docstring).
        backward_name = next(op for op in module.body.operations
                             if op.operation.name == "func.func" and op != primal).name.value
        forward = forward_module(module)
        self._rewrite(forward)
        with module.context, ir.Location.unknown():
            derived = derive_backward(forward, name=backward_name)
            _rewrite_sigmoid_complements(derived)
            dce(derived)
            self._prove_bounds(derived)
        replace_contents(module, derived)

    def _rewrite(self, module: ir.Module) -> None:
        with module.context, ir.Location.unknown():
            analysis = RangeAnalysis(module)
            for tril in [op for op in walk(module) if op.name == "kda.tril"]:
                self._rewrite_decay_product(tril, analysis)
            _rewrite_sigmoid_complements(module)
            dce(module)
            self._prove_bounds(module)

    def _prove_bounds(self, module: ir.Module) -> None:
        analysis = RangeAnalysis(module)
        for op in walk(module):
            if op.name == "kda.exp2":
                self._bound_exp2(op, analysis[op.operands[0]])

    # -- rule 1 -------------------------------------------------------------------------
    def _rewrite_decay_product(self, tril, analysis: RangeAnalysis) -> None:
        diagonal = _int_attr(tril, "diagonal")
        dot = defining_op(tril.operands[0])
        if diagonal > 0 or dot is None or dot.name != "kda.dot":
            return
        if _bool_attr(dot, "transpose_lhs") or not _bool_attr(dot, "transpose_rhs"):
            return
        lhs, rhs = _exp_scaled(dot.operands[0]), _exp_scaled(dot.operands[1])
        if lhs is None or rhs is None:
            return
        (a, gamma), (b, neg_gamma) = lhs, rhs
        if _negated(neg_gamma) != gamma:
            return
        facts = analysis[gamma]
        if facts.row_increments is None or facts.row_increments[1] > 0:
            return          # not a decaying cumsum: Γ_i − Γ_j has no sign
        subblock, exact_diagonal, bound, proof = self._choose_subblock(facts)
        decay = ir.Operation.create(
            "kda.decay_dot", results=[tril.results[0].type], operands=[a, b, gamma, gamma],
            attributes={"diagonal": _i64(diagonal), "subblock": _i64(subblock),
                        "exact_diagonal": ir.BoolAttr.get(exact_diagonal),
                        "exp_bound": _f64(bound), "exp_proof": ir.StringAttr.get(proof),
                        **({"clamp_min": _f64(-self.max_exponent)}
                           if bound >= self.max_exponent else {})},
            loc=tril.location, ip=ir.InsertionPoint(tril))
        tril.results[0].replace_all_uses_with(decay.results[0])
        tril.erase()

    def _choose_subblock(self, facts: Range) -> tuple[int, bool, float, str]:
        rows, step = facts.rows, abs(facts.row_increments[0])
        span = (rows - 1) * step if step else 0.0    # |Γ_i − Γ_j| over a whole chunk
        if self.subblock:
            size = self.subblock
        else:
            size = 1
            while size * 2 <= rows and (size * 2 - 1) * step <= self.max_exponent:
                size *= 2
        inner = (size - 1) * step if size > 1 else 0.0   # |exponent| inside one block
        if size > 1 and inner > self.max_exponent:
            raise PassError(f"kda.decay_dot: subblock={size} would need exponents up to "
                            f"{_fmt(inner)} > {_fmt(self.max_exponent)}")
        underflow = min(span, self.max_exponent)
        bound = max(inner, underflow)
        # ASCII only: MLIR escapes other bytes in printed string attributes.
        proof = (f"gamma is a row cumsum of increments in [{_fmt(facts.row_increments[0])}, "
                 f"{_fmt(facts.row_increments[1])}], so gamma_i - gamma_j in [{_fmt(-span)}, 0] "
                 "for j <= i")
        D = self.diagonal_block
        if (not self.subblock and size < D and D > 1 and rows % D == 0 and rows >= 2 * D):
            # too steep to factor inside a block: factor only left of the diagonal blocks
            proof += (f"; blocks of {D} rows: left of the diagonal block 2^(gamma_i - r) * "
                      "2^(r - gamma_j), r = gamma at the row block's first row, both exponents "
                      "<= 0; diagonal blocks in relative form")
            if span > self.max_exponent:
                proof += f"; exponents clamped below at {_fmt(-self.max_exponent)}"
            return D, True, underflow, proof
        if size > 1:
            proof += (f"; blocks of {size} rows factor as 2^(gamma_i - r) * 2^(r - gamma_j), "
                      f"r = gamma at the block's first row, |exponent| <= {_fmt(inner)} in a block")
        if span > self.max_exponent:
            proof += f"; exponents clamped below at {_fmt(-self.max_exponent)}"
        return size, False, bound, proof

    # -- rule 3 -------------------------------------------------------------------------
    def _bound_exp2(self, op, arg: Range) -> None:
        limit = self.max_exponent
        saturated = ""
        if "clamp_max" in op.attributes:        # saturated already (the forward of a backward)
            arg = Range(arg.lo, min(arg.hi, float(ir.FloatAttr(op.attributes["clamp_max"]).value)))
        elif arg.hi > limit and _feeds_only_clamps(op):
            op.attributes["clamp_max"] = _f64(limit)
            arg = Range(arg.lo, limit)
            saturated = (f"; saturated above at {_fmt(limit)}: the value reaches only kda.clamp "
                         "(an enforced gate range) through elementwise ops, and a result past "
                         "fp32's range would have been clamped there")
        if arg.hi > limit:
            users = sorted({u.owner.name for u in op.results[0].uses}) if op.results else []
            raise PassError(
                f"kda.exp2 at {op.location}: argument bound {arg} exceeds ±{_fmt(limit)} and no "
                f"bounded form applies (used by {', '.join(users) or 'nothing'}); declare a "
                "tighter gate range (a decaying gate, range (lo, 0] with any lo, always "
                f"compiles; a gate that may grow needs |g| <= {_fmt(limit * 0.6931471805599453 / max(1, _chunk(op)))} "
                f"per token at chunk size {_chunk(op)}) or write the product in relative form")
        proof = f"argument in {arg}"
        bound = max(abs(arg.hi), abs(arg.lo))
        if arg.lo < -limit:
            op.attributes["clamp_min"] = _f64(-limit)
            bound = max(abs(arg.hi), limit)
            proof += f"; clamped below at {_fmt(-limit)} (changes the value by < 2^-{_fmt(limit)})"
        op.attributes["exp_bound"] = _f64(bound)
        op.attributes["exp_proof"] = ir.StringAttr.get(proof + saturated)


# ops a saturated exponential may flow through on its way to the clamp of a gate's range
_PASS_THROUGH = {"kda.add", "kda.sub", "kda.mul", "kda.div", "kda.neg", "kda.sigmoid",
                 "kda.softplus", "kda.broadcast", "kda.assume_range"}


def _feeds_only_clamps(op) -> bool:
    """Every use of ``op``'s value reaches a ``kda.clamp`` through elementwise ops only (as
    the exp(A_log) of a gate ``-exp(A_log) * f(g_raw)`` does): then saturating the exponential
    at 2^max_exponent changes nothing the clamp lets through, and avoids inf * 0 = NaN."""
    stack, visits = [op], 0
    while stack:
        cur = stack.pop()
        visits += 1
        if visits > 10_000:             # a gate is a handful of ops; anything this large is not
            return False
        for result in cur.results:
            for use in result.uses:
                user = use.owner
                user = user.operation if hasattr(user, "operation") else user
                if user.name == "kda.clamp":
                    continue
                if user.name not in _PASS_THROUGH:
                    return False
                stack.append(user)
    return True


def _rewrite_sigmoid_complements(module: ir.Module) -> None:
    """``1 − σ(x)`` → ``σ(−x)``: the subtraction cancels catastrophically when σ(x) ≈ 1 (a
    saturated gate), losing the whole of the small result; σ(−x) computes it to full precision.
    (The sigmoid VJP ``dy·y·(1 − y)`` produces this form.)"""
    for op in walk(module):
        if op.name != "kda.sub":
            continue
        one, sig = defining_op(op.operands[0]), defining_op(op.operands[1])
        if one is None or sig is None or one.name != "kda.constant" or sig.name != "kda.sigmoid":
            continue
        if float(ir.FloatAttr(one.attributes["value"]).value) != 1.0:
            continue
        ip = ir.InsertionPoint(op)
        x = sig.operands[0]
        neg = ir.Operation.create("kda.neg", results=[x.type], operands=[x], ip=ip)
        flipped = ir.Operation.create("kda.sigmoid", results=[x.type], operands=[neg.results[0]],
                                      loc=op.location, ip=ip)
        op.results[0].replace_all_uses_with(flipped.results[0])
        op.erase()
