"""Intra-card context parallelism: a program's serial scans over P segments of each sequence
at once, exact.

A few long sequences with few heads leave the serial scans (one CTA per head and 64 value
columns, stepping through every chunk of a sequence) on a handful of SMs while the rest idle:
at B = 1, HV = 4, T = 32k the backward's reverse scan ran 1.9 ms on 8 SMs (H100). The state
map of a run of chunks is affine, ``S_end = M·S_start + E`` (M: K×K), so a sequence cut into P
segments of whole chunks can run its scans on all segments at once:

1. the program's tensors are viewed as ``B·P`` sequences of ``T / P`` tokens (the same chunks,
   so every chunk-parallel kernel does exactly its usual work, and the workspaces keep their
   layout);
2. a scan whose start state is not known per segment (the forward's state scan, the
   backward's reverse scan) runs twice beside itself: from the true start state on the
   segment where the sequence starts (the first; the last for a reverse scan) and zero on the
   others, giving each segment's ``E`` (and the first one's true end state), and from
   ``λ·I`` on every segment, giving ``λ·M + E``; ``M = (that - E) / λ`` (λ = 2^12, a power of
   two: the scaling is exact, and the kernel's TF32 roundings stay relative to ``λ·M`` as
   they would to ``M``: subtracting E only, never a value much larger than λ·M);
3. the segments' true start states are chained in float64 on the stream (``s_{p+1} = M_p·s_p +
   E_p``, P - 2 batched products), and the scan runs once more from them, writing its
   checkpoints and end states;
4. a scan whose start states are given per segment (the backward's recompute scan, from the
   forward's chained states) runs once.

The chaining needs K = V (the λ·I start state fills the [K, V] state) and sequences of a
multiple of ``C·P`` tokens, or packed sequences (``cu_seqlens``: the offsets are cut on the
device, :func:`split_cu_seqlens`; opt-in, :func:`varlen_allowed`); no host synchronisation
(CUDA graphs keep working). The scan
launches carry what they need in their manifest entry (``launch["carry"]``, from
``kdagen.codegen.lower.register_scan``); a kernel that carries a state without it is
refused. Scans cost three runs of T/P chunks (two at once) instead of one of T, run in order
after their chunk kernels (not beside them): worth it from P = 8 (:func:`segments_for`
chooses; the ops segment training calls only, kdagen.ops.segments_of).
"""
from __future__ import annotations

import math
import os

import torch

__all__ = ["LAMBDA", "SegmentsUnsupported", "segments_for", "run_segmented", "chain_starts",
           "split_cu_seqlens", "varlen_allowed", "beside_wanted"]

#: the scale of the identity start state of the transition run (an exact power of two)
LAMBDA = 2.0 ** 12
#: fewest chunks a segment may have: each run of a segment costs ~60-80 us more than its steps
#: (H100: 150-171 us for 64 forward steps of 1.44), which shorter segments pay more often; the
#: rule was measured at 64 (B1_T32k_H4)
MIN_SEGMENT_CHUNKS = 32
#: fewest segments worth it. Measured at 8 (H100, B1_T32k_H4: KDA fwd+bwd 5.54 -> 4.40 ms, GDN
#: 4.61 -> 3.69; bench/results/h100_stop53_segments_h4_kernels.log). Not at 4: there the scans
#: chained after the dq kernel take about what the unsegmented reverse scan beside it takes
#: (B1_T32k_H8: dq ~1.45 ms, reverse scan 1.89 ms beside it), so nothing is expected to gain
MIN_SEGMENTS = 8
#: the GPU's scan CTAs: value blocks of 64 columns per head (kdagen.codegen.lower.register_scan)
VALUE_BLOCK = 64
#: share of the SMs scan CTAs waiting for a chunk kernel's flags may hold
#: (kdagen.runtime.launch.OVERLAP_SM_SHARE, which the runtime checks at launch)
BESIDE_SM_SHARE = 0.5


def beside_wanted(setting: str | None = None) -> bool:
    """Whether the chaining runs go beside their chunk kernels: ``KDAGEN_SEGMENTS=beside``."""
    if setting is None:
        setting = os.environ.get("KDAGEN_SEGMENTS", "auto")
    return str(setting).strip().lower() == "beside"


class SegmentsUnsupported(ValueError):
    """The program or the call cannot run as segments (the message says why)."""


def varlen_allowed() -> bool:
    """Whether calls with ``cu_seqlens`` may run as segments: ``KDAGEN_SEGMENTS_VARLEN=1``.
    Off by default until the GPU has checked it: a sequence shorter than P chunks leaves empty
    segments (zero-length sequences the kernels never see otherwise: validation refuses them)."""
    return os.environ.get("KDAGEN_SEGMENTS_VARLEN", "0") == "1"


def split_cu_seqlens(cu_seqlens: torch.Tensor, P: int, chunk_size: int) -> torch.Tensor:
    """``[N·P + 1]`` offsets cutting each sequence of ``cu_seqlens`` into ``P`` segments of
    whole chunks, ``ceil(chunks / P)`` each (the last ones shorter or empty), on the device
    (no host synchronisation). The segments hold the same chunks as the whole sequences, in
    the same workspace rows."""
    cu = cu_seqlens.to(torch.int64)
    starts, lens = cu[:-1], cu[1:] - cu[:-1]
    chunks = (lens + chunk_size - 1) // chunk_size
    per = (chunks + P - 1) // P * chunk_size                       # tokens per segment
    p = torch.arange(P, device=cu.device, dtype=torch.int64)
    offsets = torch.minimum(p[None, :] * per[:, None], lens[:, None])
    bounds = (starts[:, None] + offsets).reshape(-1)
    return torch.cat([bounds, cu[-1:]]).to(cu_seqlens.dtype)


def segments_for(B: int, T: int, HV: int, K: int, V: int, chunk_size: int, sms: int,
                 setting: str | None = None, varlen: bool = False) -> int:
    """Segments per sequence for a call of these sizes (1: none). ``setting``: the
    ``KDAGEN_SEGMENTS`` environment variable by default — ``auto`` (the cost rule below),
    ``0``/``1``/``off`` (never), a power of two (that many, where the sizes allow), or
    ``beside`` (:func:`beside_wanted`: the most segments whose two chaining runs fit beside
    the chunk kernel they wait for, half the SMs; at least 2; not yet measured).

    The rule: the most segments, a power of two, such that each segment holds at least
    :data:`MIN_SEGMENT_CHUNKS` chunks, T divides into them, and the two scan runs that go
    side by side take at most the SMs (2·B·HV·V/64·P CTAs); none below :data:`MIN_SEGMENTS`
    (three runs of T/P chunks must beat one of T). K = V only. ``varlen``: B sequences of
    T tokens in all (cu_seqlens): T need not divide, and the average sequence is what a
    segment's chunks are counted from."""
    if setting is None:
        setting = os.environ.get("KDAGEN_SEGMENTS", "auto")
    setting = str(setting).strip().lower()
    if setting in ("0", "1", "off", "false", "") or K != V or T <= 0:
        return 1
    chunks = (T // B if varlen else T) // chunk_size

    def fits(p: int) -> bool:
        return (varlen or T % (chunk_size * p) == 0) and chunks // p >= MIN_SEGMENT_CHUNKS

    ctas = 2 * B * HV * max(1, V // VALUE_BLOCK)
    if setting == "beside":
        p = 1
        while fits(2 * p) and ctas * 2 * p <= BESIDE_SM_SHARE * sms:
            p *= 2
        return p
    if setting != "auto":
        try:
            want = int(setting)
        except ValueError:
            raise SegmentsUnsupported(f"KDAGEN_SEGMENTS={setting!r}: use auto, off, beside or "
                                      "a power of two") from None
        if want & (want - 1) or want < 1:
            raise SegmentsUnsupported(f"KDAGEN_SEGMENTS={want}: use a power of two")
        p = want
        while p > 1 and not fits(p):
            p //= 2
        return p
    p = 1
    while fits(2 * p) and ctas * 2 * p <= sms:
        p *= 2
    return p if p >= MIN_SEGMENTS else 1


def chain_starts(start: torch.Tensor, ends_from_zero: torch.Tensor, transitions: torch.Tensor,
                 reverse: bool) -> torch.Tensor:
    """The true start state of every segment, ``[B, P, ...]`` (float64).

    ``start``: each sequence's true start state ``[B, ...]`` (for a reverse scan, the state at
    its end); ``ends_from_zero``: ``[B, P, ...]``, each segment's end state when started from
    zero, except the first segment (the last, reversed), started from ``start``;
    ``transitions``: ``[B, P, K, K]``-shaped per head (``[B, P, HV, K, K]``), M of each segment
    (the first one's unused)."""
    P = ends_from_zero.shape[1]
    order = list(range(P - 1, -1, -1)) if reverse else list(range(P))
    starts = [None] * P
    starts[order[0]] = start
    end = ends_from_zero[:, order[0]]
    for i, p in enumerate(order[1:], 1):
        starts[p] = end
        if i + 1 < P:
            end = torch.matmul(transitions[:, p], end) + ends_from_zero[:, p]
    return torch.stack(starts, 1)


def _check(prog, launches, known: tuple, tensors: dict) -> dict:
    """{argument: carry} of the scans to chain; raises SegmentsUnsupported where the call or
    the program cannot run as segments."""
    chained = {}
    for la in launches:
        entry = la.kernel.entry.launch
        carry = entry.get("carry")
        if carry is None:
            if entry.get("carries_state"):
                raise SegmentsUnsupported(f"segments: {la.name} carries a state the runtime "
                                          "cannot chain (no register scan)")
            continue
        init, final = carry.get("init"), carry.get("final")
        if init is None:
            raise SegmentsUnsupported(f"segments: {la.name} starts from a constant state; run "
                                      "the variant with an initial state")
        if init in known:
            continue
        if final is None:
            raise SegmentsUnsupported(f"segments: {la.name} stores no end state, and its start "
                                      f"states ({init}) are not given per segment")
        chained[la.name] = carry
    args = {a["name"]: a for a in prog.args}
    finals = {c["final"] for c in chained.values()}
    for a in prog.args:
        if a["role"] == "output" and a["layout"] == "state" and a["name"] not in finals:
            raise SegmentsUnsupported(f"segments: output {a['name']} is a state no chained "
                                      "scan ends in")
        if a["layout"] in ("pool", "slots") and tensors.get(a["name"]) is not None:
            raise SegmentsUnsupported(f"segments: {a['layout']} argument {a['name']}")
    for name in known:
        if name not in args or args[name]["layout"] != "state":
            raise SegmentsUnsupported(f"segments: {name} is not a state input of "
                                      f"{prog.variant}")
    return chained


def run_segmented(prog, P: int, known: tuple, tensors: dict, *, device=None,
                  poison: bool = False, stream=None, chip: str | None = None,
                  profile: list | None = None, timed: bool = False,
                  beside: bool = False) -> dict:
    """Run ``prog`` (a :class:`kdagen.runtime.launch.LoweredProgram`) with each sequence cut
    into ``P`` segments (module doc). ``known``: state inputs given per segment
    (``[B·P, ...]``); the others are per sequence. Returns the outputs as an ordinary call
    would, plus ``segment_<input>``: the segments' start states ``[B·P, ...]`` of each scan
    it chained (what a backward gives back as ``known``). ``timed``: CUDA events around every
    launch (``profile`` or a launch recorder is listening). ``beside``: a scan that waits for
    its chunk kernel's flags runs beside it where its CTAs (both chaining runs) fit
    (``prog.fits_beside``), as an unsegmented call does; else every kernel runs in order."""
    token = next(a for a in prog.args if a["role"] == "input" and a["layout"] == "token"
                 and a["heads"] == "v")
    x = tensors[token["name"]]
    B, T = int(x.shape[0]), int(x.shape[1])
    cu = tensors.get("cu_seqlens")
    if P < 2:
        raise SegmentsUnsupported(f"segments: {P} segments")
    seg_tensors = dict(tensors)
    if cu is not None:          # packed sequences: the offsets cut, the tokens as they are
        B = int(cu.shape[0]) - 1
        seg_tensors["cu_seqlens"] = split_cu_seqlens(cu, P, prog.C)
    else:
        if T % (prog.C * P):
            raise SegmentsUnsupported(f"segments: T = {T} is not a multiple of {prog.C * P} "
                                      f"({P} segments of whole chunks)")
        for a in prog.args:
            t = tensors.get(a["name"])
            if isinstance(t, torch.Tensor) and a["role"] == "input" and a["layout"] == "token":
                seg_tensors[a["name"]] = t.reshape(B * P, T // P, *t.shape[2:])
    device, sz, values, outputs = prog.bind(device, poison, seg_tensors)
    plan, stream = prog.prepare_launches(device, sz, values, poison, stream, chip)
    chained = _check(prog, plan.launches, known, tensors)
    # every check before the first launch: a refused call has run nothing (the ops then run
    # it whole)
    for name in known:
        if values[name].shape[0] != B * P:
            raise SegmentsUnsupported(f"segments: {name} has {values[name].shape[0]} start "
                                      f"states, expected B·P = {B * P}")
    for carry in chained.values():
        start = values[carry["init"]]
        if start.shape[0] != B:
            raise SegmentsUnsupported(f"segments: {carry['init']} has {start.shape[0]} "
                                      f"states, expected one per sequence ({B})")
        if start.shape[-2] != start.shape[-1]:
            raise SegmentsUnsupported(f"segments: the state is [{start.shape[-2]}, "
                                      f"{start.shape[-1]}]; chaining needs K = V")
    starts = {}
    launches = list(plan.launches)
    i = 0
    while i < len(launches):
        la = launches[i]
        nxt = launches[i + 1] if i + 1 < len(launches) else None
        pair = (beside and la.flags == "publish" and nxt is not None and nxt.flags == "wait"
                and nxt.kernel.entry.launch.get("carry") is not None)
        if pair and nxt.name not in chained:       # a scan from known start states: one run
            ctas = math.prod(nxt.grid)
            if prog.fits_beside(ctas, device):
                prog.launch_beside(la, prog._args(la, values, device, flags=True),
                                   [(nxt, prog._args(nxt, values, device, aside=True,
                                                     flags=True))], device, stream, profile,
                                   scan_first=nxt.scan_first)
                i += 2
                continue
        if pair and nxt.name in chained and prog.fits_beside(2 * math.prod(nxt.grid), device):
            _chain(prog, nxt, chained[nxt.name], values, starts, B, P, device, stream, profile,
                   timed, publisher=la)
            i += 2
            continue
        carry = chained.get(la.name)
        if carry is None:
            prog._launch(la, prog._args(la, values, device), stream, profile, timed)
        else:
            _chain(prog, la, carry, values, starts, B, P, device, stream, profile, timed)
        i += 1
    result = {}
    argmap = {a["name"]: a for a in prog.args}
    last_of = {c["final"]: (0 if c["reverse"] else P - 1) for c in chained.values()}
    for name, out in outputs.items():
        a = argmap[name]
        if a["layout"] == "token":
            result[name] = out if cu is not None else out.view(B, T, *out.shape[2:])
        elif a["layout"] == "state":
            result[name] = out.view((B, P) + tuple(out.shape[1:]))[:, last_of[name]].contiguous()
        else:
            result[name] = out
    for name, t in starts.items():
        result[f"segment_{name}"] = t
    return result


def _chain(prog, la, carry: dict, values: dict, starts: dict, B: int, P: int, device, stream,
           profile, timed: bool, publisher=None) -> None:
    """Run scan ``la`` over the segments, chained (module doc, steps 2 and 3): its two
    chaining runs side by side (and beside ``publisher``, the chunk kernel whose flags they
    wait for, when given), the start states chained, then the true run; the segments' start
    states go to ``starts[init]``."""
    init, final, reverse = carry["init"], carry["final"], bool(carry["reverse"])
    start = values[init]                                       # [B, HV, K, K]
    K = int(start.shape[-1])
    tail = tuple(start.shape[1:])
    first = P - 1 if reverse else 0
    from_zero = start.new_zeros((B, P) + tail)
    from_zero[:, first] = start
    from_zero = from_zero.view((B * P,) + tail)
    eye = torch.eye(K, dtype=start.dtype, device=device) * LAMBDA
    from_eye = eye.expand((B * P,) + tail).contiguous()
    end_zero, end_eye = torch.empty_like(from_zero), torch.empty_like(from_zero)
    # both runs write the scan's checkpoint workspaces; the true run below rewrites them
    run_zero = dict(values, **{init: from_zero, final: end_zero})
    run_eye = dict(values, **{init: from_eye, final: end_eye})
    if publisher is None:
        prog.launch_beside(la, prog._args(la, run_zero, device),
                           [(la, prog._args(la, run_eye, device, aside=True))],
                           device, stream, profile)
    else:
        prog.launch_beside(publisher, prog._args(publisher, values, device, flags=True),
                           [(la, prog._args(la, run_zero, device, aside=True, flags=True)),
                            (la, prog._args(la, run_eye, device, aside=True, flags=True,
                                            side=1))],
                           device, stream, profile, scan_first=la.scan_first)
    ends = end_zero.view((B, P) + tail).double()
    transitions = (end_eye.view((B, P) + tail).double() - ends) / LAMBDA
    true_starts = chain_starts(start.double(), ends, transitions, reverse)
    values[init] = true_starts.to(start.dtype).view((B * P,) + tail).contiguous()
    prog._launch(la, prog._args(la, values, device), stream, profile, timed)
    starts[init] = values[init]

