"""Context parallelism across processes: one packed (varlen) sequence batch split over the ranks
of a ``torch.distributed`` group, exact.

Each rank holds ``T / world_size`` consecutive tokens of the packed batch (FLA's convention)
and calls ``kdagen.chunk_kda`` / ``kdagen.chunk_gated_delta_rule`` with ``cp_context=`` (from
:func:`build_cp_context`, built from the *global* ``cu_seqlens``). A sequence that crosses a
rank boundary needs the state it has at the start of the rank's tokens, which depends on every
earlier rank. The state map of a segment is affine, ``S_end = M·S_start + E``, so:

1. the rank whose tokens end inside a sequence that goes on to the next rank computes, for that
   last segment, ``E`` (its end state from the true start state when the sequence starts on
   this rank, from zero otherwise) and, when the sequence started on an earlier rank, the
   K×K transition ``M``: the same chunked op run on the segment with ``v = 0`` and the
   identity as initial state (its final state is the product of the chunks' transitions). Both
   are one call of the op, the two runs as two sequences of one varlen batch;
2. the ranks all-gather ``(M, E)``;
3. each rank chains the maps of the ranks its first segment spans, ``S = M_j·S + E_j`` from the
   rank where the sequence starts, and runs the op on its tokens with that initial state.

The backward is autograd through these calls, the chaining and a differentiable all-gather
(whose backward sums each rank's gradients over the group with an all-reduce, which gloo and
NCCL both have), so gradients reach earlier ranks exactly, and ``initial_state`` /
``output_final_state`` work in CP mode too (beyond FLA): ``initial_state`` is the global
``[N, HV, K, V]``, the same on every rank; the final state is rank-local, ``[n_local, HV, K,
V]``, the state after each of the rank's segments: the sequence's final state where it ends on
this rank, the state at the rank's last token where it goes on. Every rank's backward runs one
all-reduce (the all-gather's), so every rank must call backward, as with any collective.

The transition and the end states come from the DSL's chunked forward and its derived backward
(the same kernels, through the same passes); the all-gather carries ``HV·K·(K + V)`` floats per
rank. Cost per rank: the op on its tokens, plus the op once more (twice the tokens) on the
last segment when a sequence crosses its end. Needs K = V (the transition run feeds K-wide
zero values through the op compiled for V).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from kdagen.validation import KdagenInputError

__all__ = ["CPContext", "build_cp_context", "cp_call"]


@dataclass(frozen=True)
class CPContext:
    """What one rank needs to run its share of a packed batch (see the module doc).

    ``cu_seqlens``: the rank-local offsets of its segments (``[n_local + 1]``, int64, on the
    device given to :func:`build_cp_context`), ``cu_seqlens_cpu`` the same on the host;
    ``seq_ids``: the global sequence of each local segment; ``first_continues``: the first
    segment's sequence started on an earlier rank; ``last_continues``: the last segment's
    sequence goes on to a later rank; ``starts``: for every rank, the rank where its first
    segment's sequence starts (itself when it starts there); ``num_seqs``: N, the global
    number of sequences."""
    group: object
    rank: int
    world_size: int
    tokens_per_rank: int
    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    seq_ids: tuple
    first_continues: bool
    last_continues: bool
    starts: tuple
    num_seqs: int


def build_cp_context(cu_seqlens, group=None, *, device=None) -> CPContext:
    """The context of this rank of ``group`` (default: the world) for the packed batch given by
    the global ``cu_seqlens`` ``[N + 1]`` (tensor or list, any device; the same on every rank):
    the rank holds tokens ``[rank·T/R, (rank + 1)·T/R)`` of the ``T = cu_seqlens[-1]`` tokens.
    ``device``: where the local ``cu_seqlens`` goes (default: that of ``cu_seqlens``)."""
    if not dist.is_available() or not dist.is_initialized():
        raise KdagenInputError("cp_context: torch.distributed is not initialised; call "
                               "torch.distributed.init_process_group first")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.ndim != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise KdagenInputError(
                f"cu_seqlens: expected a 1-D int32/int64 tensor [N + 1], got dtype "
                f"{cu_seqlens.dtype} and shape {list(cu_seqlens.shape)}")
        device = cu_seqlens.device if device is None else device
        offsets = [int(x) for x in cu_seqlens.cpu().tolist()]
    else:
        offsets = [int(x) for x in cu_seqlens]
        device = torch.device("cpu") if device is None else device
    if len(offsets) < 2 or offsets[0] != 0 or any(b <= a for a, b in zip(offsets, offsets[1:])):
        raise KdagenInputError(
            f"cu_seqlens: expected strictly increasing offsets starting at 0 (every sequence at "
            f"least one token), got {offsets[:8]}{'...' if len(offsets) > 8 else ''}")
    total = offsets[-1]
    if total % world:
        raise KdagenInputError(
            f"cu_seqlens: {total} tokens do not split evenly over {world} ranks; pad the "
            f"packed batch to a multiple of {world} tokens (e.g. with a short extra sequence)")
    per = total // world

    def local(r):
        lo, hi = r * per, (r + 1) * per
        cuts = [0]
        ids = []
        for n in range(len(offsets) - 1):
            a, b = max(offsets[n], lo), min(offsets[n + 1], hi)
            if a < b:
                ids.append(n)
                cuts.append(b - lo)
        return cuts, ids, offsets[ids[0]] < lo, offsets[ids[-1] + 1] > hi

    starts = []
    for r in range(world):
        _, ids, first_cont, _ = local(r)
        seq_start = offsets[ids[0]]
        starts.append(seq_start // per if first_cont else r)
    cuts, ids, first_cont, last_cont = local(rank)
    cpu = torch.tensor(cuts, dtype=torch.int64)
    return CPContext(group, rank, world, per, cpu.to(device), cpu, tuple(ids), first_cont,
                     last_cont, tuple(starts), len(offsets) - 1)


class _AllGather(torch.autograd.Function):
    """all_gather whose backward gives each rank the sum over the group of the gradients of its
    piece (an all-reduce: gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        x = x.contiguous()
        out = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, x, group=group)
        return torch.stack(out)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return None, grad[dist.get_rank(ctx.group)]


def _all_gather(x: torch.Tensor, group) -> torch.Tensor:
    if torch.is_grad_enabled() and not x.requires_grad:
        # a rank whose piece is constant still joins the backward's all-reduce: the other
        # ranks' gradients pass through it
        x = x.detach().requires_grad_()
    return _AllGather.apply(group, x)


class _Tie(torch.autograd.Function):
    """``x`` unchanged, with ``other`` made an input of it for autograd (a zero gradient): ties
    a collective's backward into every rank's graph."""

    @staticmethod
    def forward(ctx, x, other):
        ctx.other = (other.shape, other.dtype, other.device)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        shape, dtype, device = ctx.other
        return grad, torch.zeros(shape, dtype=dtype, device=device)


def _segment(x, lo, hi):
    return x[:, lo:hi] if isinstance(x, torch.Tensor) else x


def cp_call(call: Callable, ctx: CPContext, q, k, v, g, beta, *, initial_state,
            output_final_state: bool) -> tuple:
    """Run ``call(q, k, v, g, beta, initial_state=..., output_final_state=..., cu_seqlens=...)``
    (the chunked op with every other argument bound) on this rank's tokens of the packed batch
    described by ``ctx``: returns ``(o, final_state)`` with o the rank's ``[1, T/R, HV, V]``
    and final_state ``[n_local, HV, K, V]`` (the state after each local segment) or None."""
    if not isinstance(ctx, CPContext):
        raise KdagenInputError(f"cp_context: expected a kdagen.cp.CPContext from "
                               f"kdagen.cp.build_cp_context, got {type(ctx).__name__}")
    if q.ndim != 4 or q.shape[0] != 1 or q.shape[1] != ctx.tokens_per_rank:
        raise KdagenInputError(
            f"q: in CP mode each rank passes its [1, T / world_size, H, K] tokens; expected "
            f"T / world_size = {ctx.tokens_per_rank}, got shape {list(q.shape)}")
    HV, K, V = int(v.shape[2]), int(q.shape[3]), int(v.shape[3])
    if K != V:
        raise KdagenInputError(f"cp_context: needs K = V (the transition runs the op on K-wide "
                               f"values); got K = {K}, V = {V}")
    N = ctx.num_seqs
    if initial_state is not None and (initial_state.ndim != 4 or initial_state.shape[0] != N):
        raise KdagenInputError(
            f"initial_state: in CP mode the global [N = {N}, HV, K, V] (the same on every "
            f"rank), got shape {list(initial_state.shape)}")
    cuts = [int(c) for c in ctx.cu_seqlens_cpu.tolist()]
    n_local = len(cuts) - 1
    dev = q.device
    state_kw = dict(dtype=torch.float32, device=dev)

    def own_h0(i):
        """The initial state of local segment i when its sequence starts on this rank."""
        if initial_state is None:
            return torch.zeros(HV, K, V, **state_kw)
        return initial_state[ctx.seq_ids[i]].to(torch.float32)

    # 1. this rank's map of the sequence that crosses its end
    single = n_local == 1 and ctx.first_continues
    if ctx.last_continues:
        lo, hi = cuts[-2], cuts[-1]
        seg = [_segment(x, lo, hi) for x in (q, k, v, g, beta)]
        start = torch.zeros(HV, K, V, **state_kw) if single else own_h0(n_local - 1)
        if single:     # started on an earlier rank: the transition as well
            twice = [torch.cat([x, x], dim=1) for x in seg]
            twice[2] = torch.cat([seg[2], torch.zeros_like(seg[2])], dim=1)
            eye = torch.eye(K, **state_kw).expand(HV, K, K)
            _, ends = call(*twice, initial_state=torch.stack([start, eye]),
                           output_final_state=True,
                           cu_seqlens=torch.tensor([0, hi - lo, 2 * (hi - lo)], device=dev))
            E, M = ends[0], ends[1]
        else:
            _, ends = call(*seg, initial_state=start[None], output_final_state=True,
                           cu_seqlens=torch.tensor([0, hi - lo], device=dev))
            E, M = ends[0], torch.zeros(HV, K, K, **state_kw)
    else:
        E, M = torch.zeros(HV, K, V, **state_kw), torch.zeros(HV, K, K, **state_kw)
    # 2. every rank's map
    maps = _all_gather(torch.cat([M, E], dim=-1), ctx.group)       # [R, HV, K, K + V]
    # 3. the start state of the first segment, then the op on this rank's tokens
    h0 = [own_h0(i) for i in range(n_local)]
    if ctx.first_continues:
        S = torch.zeros(HV, K, V, **state_kw)
        for j in range(ctx.starts[ctx.rank], ctx.rank):
            S = maps[j, :, :, :K] @ S + maps[j, :, :, K:]
        h0[0] = S
    # every rank's backward must run the all-gather's collective once, also where its tokens
    # do not read the gathered maps (rank 0, or a first segment that starts here)
    h0 = _Tie.apply(torch.stack(h0), maps)
    o, ht = call(q, k, v, g, beta, initial_state=h0, output_final_state=output_final_state,
                 cu_seqlens=ctx.cu_seqlens)
    return o, ht
