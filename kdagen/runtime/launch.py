"""Run a lowered program variant from a bundle with torch tensors (imports no MLIR).

::

    from kdagen.runtime.launch import LoweredProgram
    prog = LoweredProgram(bundle_dir, variant)          # a name from lowered.json
    out = prog(q=q, k=k, v=v, g_raw=g, beta_raw=b, A_log=a, dt_bias=dtb,
               initial_state=h0, cu_seqlens=cu, scale=0.125)
    out["o"], out["final_state"]

Inputs are converted to the dtypes the kernels take (bf16/f16/f32 storage as the program
declares, cu_seqlens int64, state_slots int32/int64) and made contiguous; outputs, workspaces
and scratch are allocated here (outputs poisoned with NaN unless ``poison=False``), except an
output of layout ``pool`` (a state pool the kernels write rows of): the caller passes it under
its name (``final_state=pool``, the same tensor as ``initial_state`` to update the pool in
place), in the kernels' dtype, contiguous, and it is written there; kernels are launched in the order of
the bundle on torch's current stream. The parameter order of each kernel is taken from the
manifest, so this file encodes no calling convention beyond the names:
program arguments and workspaces by name, ``T``/``N``/``HV`` (i32), f32 scalars by name,
``scratch`` (per-launch buffer of ``scratch_bytes_per_cta`` bytes per CTA of the grid), and
TMA tensor maps named in ``launch["tensor_maps"]`` (kdagen.runtime.tensormap): a parameter of
kind ``ptr`` gets the address of a device copy of the map, one of kind ``tmap`` the map's 128
bytes by value.

Per-launch times: ``profile=[...]`` on one call, or :class:`LaunchRecorder` around any code
that reaches the launcher (``kdagen.chunk_kda`` included, and the backward that autograd
runs): a :class:`LaunchRecord` (kernel, grid, manifest entry, CUDA events) per launch.
"""
from __future__ import annotations

import ast
import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from . import chips
from .bundle import FLAGS_PARAM, LOWERED, KernelEntry
from .loader import KernelLibrary
from .tensormap import MapSpec, tensor_map, tensor_map_bytes

_TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
                 "i64": torch.int64, "i32": torch.int32}


def list_variants(bundle_dir) -> dict:
    return json.loads((Path(bundle_dir) / LOWERED).read_text())["variants"]


@functools.lru_cache(maxsize=1024)
def _parse_rule(rule: str):
    # parsed once per rule: ast.parse + compile per launch were ~10% of a call's host time
    return ast.parse(rule, mode="eval")


def eval_rule(rule, env: dict) -> int:
    """Evaluate a grid rule ("HV", "ceil_div(tokens * H * 64, 256)", 3...) over ``env``."""
    if isinstance(rule, int):
        return rule
    tree = _parse_rule(str(rule))

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return int(env[node.id])
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.FloorDiv):
                return a // b
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "ceil_div" and len(node.args) == 2):
            a, b = ev(node.args[0]), ev(node.args[1])
            return -(-a // b)
        raise ValueError(f"unsupported grid rule {rule!r}")

    return ev(tree)


@dataclass
class LaunchRecord:
    """One kernel launch seen by a :class:`LaunchRecorder`: CUDA events recorded on the
    launch's stream just before and just after the launch."""
    name: str
    grid: tuple
    entry: KernelEntry
    start: torch.cuda.Event
    end: torch.cuda.Event

    def elapsed_us(self) -> float:
        """Microseconds between the two events (call after a synchronize)."""
        return 1e3 * self.start.elapsed_time(self.end)


# The active recorders. Module-level, not per thread: the public API reaches the launcher
# through the executor with no way to hand it a profile list, and autograd launches the
# backward's kernels from its own worker thread.
_RECORDERS: list["LaunchRecorder"] = []


class LaunchRecorder:
    """``with LaunchRecorder() as rec: ...``: every launch of every :class:`LoweredProgram`
    inside the block is bracketed by CUDA events and appended to ``rec.records``. Adds two
    event records per launch, so leave it off outside measurements."""

    def __init__(self):
        self.records: list[LaunchRecord] = []

    def __enter__(self) -> "LaunchRecorder":
        _RECORDERS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _RECORDERS[:] = [r for r in _RECORDERS if r is not self]


_VALUE, _TMAP, _TMAP_BYTES, _SCRATCH = "value", "tensor map", "tensor map bytes", "scratch"
_PLANS_KEPT = 64
_ARENA_ALIGN = 256          # bytes: each workspace of a call's arena starts on this boundary


@dataclass(frozen=True)
class _Launch:
    """One kernel launch of a call: the grid and, per kernel parameter, (kind, key, extra):
    a value by name, a tensor map of a named tensor (extra: its MapSpec) as the address of
    a device copy or as its bytes (a grid-constant parameter), or a scratch buffer of key
    float32 elements."""
    name: str
    kernel: object          # LoadedKernel
    grid: tuple
    params: tuple
    flags: str | None = None   # launch["chunk_flags"]: "publish" / "wait" (or None)
    scan_first: bool = False   # a waiting scan launched before its chunk kernel
                               # (launch["overlap_order"] == "scan")


@dataclass(frozen=True)
class _CallPlan:
    """What a call of one size does: its launches, and where each workspace lies in the
    call's one workspace allocation ((name, shape, dtype, byte offset, bytes) each)."""
    launches: tuple
    workspaces: tuple
    arena_bytes: int


class LoweredProgram:
    def __init__(self, bundle_dir, variant: str, library: KernelLibrary | None = None):
        self.bundle_dir = Path(bundle_dir)
        variants = list_variants(bundle_dir)
        if variant not in variants:
            raise KeyError(f"bundle {bundle_dir} has no variant {variant!r}; it has {sorted(variants)}")
        self.variant = variant
        self.spec = variants[variant]
        self.library = library or KernelLibrary(self.bundle_dir)
        self.args = self.spec["args"]
        self.C = int(self.spec["chunk_size"])
        self.ratio = int(self.spec["gva_ratio"])
        self._plans: dict = {}

    def kernel_names(self, chip: str) -> list[str]:
        return self.spec["chips"].get(chip) or self.spec["kernels"]

    def sizes(self, tensors: dict) -> dict:
        tok = None
        for a in self.args:
            if a["role"] == "input" and a["layout"] == "token" and a["heads"] == "v":
                tok = tensors[a["name"]]
                break
        Bsz, T, HV = (int(d) for d in tok.shape[:3])
        cu = tensors.get("cu_seqlens")
        per_seq = ceil_div(T, self.C)
        if cu is not None:
            # Never read cu_seqlens on the host (that would synchronise with the device and
            # break CUDA-graph capture): size by bounds. Sequence n's chunks start at row
            # sum_{m<n} ceil(len_m / C) <= T / C + n, so ceil(T / C) + N rows hold them all, and
            # no sequence has more than ceil(T / C) chunks (chunk CTAs past a sequence's end exit).
            N = int(cu.shape[0]) - 1
            total, longest = per_seq + N, per_seq
        else:
            N = Bsz
            total, longest = Bsz * per_seq, per_seq
        return dict(B=Bsz, T=T, HV=HV, H=HV // self.ratio, N=N, tokens=Bsz * T,
                    total_chunks=total, max_chunks=longest if T > 0 else 0)

    @staticmethod
    def _workspaces(plan: _CallPlan, device, poison: bool) -> dict:
        """The call's workspaces, carved from one allocation (one caching-allocator request
        per call instead of one per workspace; each piece 256-byte aligned for TMA). They die
        with the call, as separate tensors would: none is returned."""
        if not plan.workspaces:
            return {}
        arena = torch.empty(max(1, plan.arena_bytes), dtype=torch.uint8, device=device)
        out = {}
        typed = {}          # the arena seen as each element type: one strided view per piece
        for name, shape, dtype, offset, nbytes in plan.workspaces:
            base = typed.get(dtype)
            if base is None:
                base = typed[dtype] = arena.view(dtype)
            x = base.as_strided(shape, _contiguous_strides(shape), offset // dtype.itemsize)
            if name == FLAGS_PARAM:
                x.zero_()                   # no chunk is ready before the call's kernels run
            elif poison and x.is_floating_point():
                x.fill_(float("nan"))
            out[name] = x
        return out

    @staticmethod
    def _lead(layout, heads, sz) -> tuple:
        if layout == "token":
            return (sz["B"], sz["T"], sz["H"] if heads == "qk" else sz["HV"])
        if layout == "state":
            return (sz["N"], sz["HV"])
        if layout == "chunk":
            return (max(1, sz["total_chunks"]), sz["HV"])
        if layout == "head":
            return (sz["HV"],)
        raise ValueError(layout)

    def _alloc(self, layout, heads, tail, dtype, sz, device, poison):
        x = torch.empty(self._lead(layout, heads, sz) + tuple(tail), dtype=_TORCH_DTYPES[dtype],
                        device=device)
        if poison and x.is_floating_point():
            x.fill_(float("nan"))
        return x

    def _pool_output(self, a: dict, x, device):
        """The caller's tensor a pool output is written into (checked, never copied: a copy
        would not be written back)."""
        name, dtype = a["name"], _TORCH_DTYPES[a["dtype"]]
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{self.variant}: output {name!r} is a state pool; pass the "
                             f"tensor it writes into as {name}=...")
        if x.dtype != dtype or not x.is_contiguous() or x.device != device:
            raise ValueError(f"{self.variant}: output {name!r} must be a contiguous {dtype} "
                             f"tensor on {device}, got {x.dtype} on {x.device}"
                             f"{'' if x.is_contiguous() else ' (not contiguous)'}")
        if x.dim() != 2 + len(a["tail"]) or list(x.shape[2:]) != list(a["tail"]):
            raise ValueError(f"{self.variant}: output {name!r}: a pool [slots, HV, "
                             f"{', '.join(map(str, a['tail']))}], got {list(x.shape)}")
        return x

    def _plan(self, chip: str, device, sz: dict) -> _CallPlan:
        """The launches of a call of these sizes on ``device`` (kernel, grid and how each
        parameter is filled) and its workspace layout, worked out once per (chip, device,
        sizes) — a call then only fills in its tensors (the grid rules, the manifest's
        parameter lists and its tensor-map entries were re-read per launch: host time a
        forward of three kernels spent)."""
        key = (chip, device.type, device.index, tuple(sz.values()))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        workspaces, offset = [], 0
        for w in (self.spec.get("chip_workspaces") or {}).get(chip, self.spec["workspaces"]):
            shape = self._lead(w["layout"], w.get("heads"), sz) + tuple(w["tail"])
            dtype = _TORCH_DTYPES[w["elt"]]
            nbytes = dtype.itemsize * math.prod(int(d) for d in shape)
            workspaces.append((w["name"], shape, dtype, offset, nbytes))
            offset += -(-nbytes // _ARENA_ALIGN) * _ARENA_ALIGN
        launches = []
        for name in self.kernel_names(chip):
            kern = self.library.get(name, device)
            launch = kern.entry.launch
            grid = tuple(eval_rule(g, sz) for g in launch["grid"])
            if min(grid) <= 0:
                continue
            tmaps = launch.get("tensor_maps") or {}
            params = []
            for p in kern.entry.params:
                if p["name"] in tmaps:
                    spec = tmaps[p["name"]]
                    kind = _TMAP_BYTES if p["kind"] == "tmap" else _TMAP
                    params.append((kind, spec["tensor"], MapSpec.of(spec)))
                elif p["name"] == "scratch":
                    nbytes = int(launch["scratch_bytes_per_cta"]) * grid[0] * grid[1] * grid[2]
                    params.append((_SCRATCH, max(1, nbytes // 4), None))
                else:
                    params.append((_VALUE, p["name"], None))
            launches.append(_Launch(name, kern, grid, tuple(params), launch.get("chunk_flags"),
                                    launch.get("overlap_order") == "scan"))
        if any(p["name"] == FLAGS_PARAM for la in launches for p in la.kernel.entry.params):
            # one i32 flag per (chunk row, head), zeroed at every call (``_workspaces``)
            shape = self._lead("chunk", "v", sz)
            workspaces.append((FLAGS_PARAM, shape, torch.int32, offset, 4 * math.prod(shape)))
            offset += -(-4 * math.prod(shape) // _ARENA_ALIGN) * _ARENA_ALIGN
        if len(self._plans) >= _PLANS_KEPT:     # sizes vary (varlen, decode batches): bounded
            self._plans.pop(next(iter(self._plans)))
        plan = self._plans[key] = _CallPlan(tuple(launches), tuple(workspaces), offset)
        return plan

    def __call__(self, device=None, poison: bool = True, stream=None, chip: str | None = None,
                 profile: list | None = None, segments: int = 1, segment_known: tuple = (),
                 segments_beside: bool = False, **tensors) -> dict:
        """Run the variant; ``profile`` (a list): append (kernel name, start, end) CUDA events
        around every launch (read them after a synchronize: per-kernel times). ``segments``
        > 1: each sequence runs as that many segments, its serial scans over all of them at
        once and the states where they meet chained exactly (kdagen.runtime.segments;
        ``segment_known``: the scan inputs given per segment already; ``segments_beside``:
        scans beside the chunk kernels whose flags they wait for, where they fit)."""
        if segments > 1:
            from .segments import run_segmented
            return run_segmented(self, int(segments), tuple(segment_known), tensors,
                                 device=device, poison=poison, stream=stream, chip=chip,
                                 profile=profile,
                                 timed=profile is not None or bool(_RECORDERS),
                                 beside=bool(segments_beside))
        device, sz, values, outputs = self.bind(device, poison, tensors)
        plan, stream = self.prepare_launches(device, sz, values, poison, stream, chip)
        self.run_launches(plan.launches, values, device, stream, profile)
        return outputs

    def bind(self, device, poison: bool, tensors: dict) -> tuple:
        """(device, sizes, values by argument name, the outputs allocated): the call's
        tensors converted to the kernels' storage types, its outputs allocated."""
        device = torch.device(device) if device is not None else next(
            t.device for t in tensors.values() if isinstance(t, torch.Tensor))
        sz = self.sizes(tensors)
        values: dict = {"T": sz["T"], "N": sz["N"], "HV": sz["HV"]}
        outputs = {}
        for a in self.args:
            name = a["name"]
            if a["layout"] == "scalar":
                v = tensors.get(name)
                values[name] = float(a["default"] if v is None else v)
                continue
            if a["role"] == "input":
                if name not in tensors or tensors[name] is None:
                    raise ValueError(f"{self.variant}: missing input {name!r}")
                x = tensors[name].to(device=device, dtype=_TORCH_DTYPES[a["dtype"]]).contiguous()
                if x.data_ptr() % 16:        # TMA and vector loads want 16-byte aligned rows
                    x = x.clone()
                values[name] = x
            elif a["layout"] == "pool":
                x = self._pool_output(a, tensors.get(name), device)
                values[name] = x
                outputs[name] = x
            else:
                x = self._alloc(a["layout"], a["heads"], a["tail"], a["dtype"], sz, device, poison)
                values[name] = x
                outputs[name] = x
        return device, sz, values, outputs

    def prepare_launches(self, device, sz: dict, values: dict, poison: bool, stream,
                         chip: str | None) -> tuple:
        """(the call plan, the stream): the launches of these sizes, and the call's
        workspaces added to ``values``."""
        if chip is None:
            chip = chips.chip_for_device(device.index if device.index is not None
                                   else torch.cuda.current_device())
        plan = self._plan(chip, device, sz)
        values.update(self._workspaces(plan, device, poison))
        if stream is None and device.type == "cuda":  # one lookup per call, not per launch
            stream = torch.cuda.current_stream(device)
        return plan, stream

    def run_launches(self, launches, values: dict, device, stream, profile) -> None:
        """Launch ``launches`` in order on ``stream``, a register scan beside the chunk kernel
        that publishes its chunks where both carry chunk-ready flags."""
        timed = profile is not None or bool(_RECORDERS)
        i = 0
        while i < len(launches):
            launch = launches[i]
            nxt = launches[i + 1] if i + 1 < len(launches) else None
            if (launch.flags == "publish" and nxt is not None and nxt.flags == "wait"
                    and _overlap_ok(nxt.grid, device)):
                # both argument lists first: a tensor map's device copy goes out on this
                # stream, before the fork the side stream waits for
                args = (self._args(launch, values, device, flags=True),
                        self._args(nxt, values, device, aside=True, flags=True))
                self.launch_beside(launch, args[0], [(nxt, args[1])], device, stream, profile,
                                   scan_first=nxt.scan_first)
                i += 2
                continue
            self._launch(launch, self._args(launch, values, device), stream, profile, timed)
            i += 1

    def launch_beside(self, first, first_args, beside: list, device, stream,
                      profile, scan_first: bool = False) -> None:
        """``first`` on ``stream`` and each ``(launch, args)`` of ``beside`` on a side stream
        of its own (the k-th on side stream k), all at the same time; later work on
        ``stream`` waits for every one. ``scan_first``: ``beside`` is launched before
        ``first`` (its CTAs take their SMs before ``first``'s grid fills them)."""
        timed = profile is not None or bool(_RECORDERS)
        fork = torch.cuda.Event()
        fork.record(stream)
        if not scan_first:
            self._launch(first, first_args, stream, profile, timed)
        joins = []
        for k, (launch, args) in enumerate(beside):
            aside = _side_stream(device, k)
            aside.wait_event(fork)      # each sees every earlier kernel's output
            self._launch(launch, args, aside, profile, timed)
            joins.append(torch.cuda.Event())
            joins[-1].record(aside)
        if scan_first:                  # before the joins: it must not wait for the scans
            self._launch(first, first_args, stream, profile, timed)
        for join in joins:
            stream.wait_event(join)     # later kernels read what they wrote

    @staticmethod
    def fits_beside(ctas: int, device) -> bool:
        """Whether scan CTAs that wait for a chunk kernel's flags may run beside it: at most
        OVERLAP_SM_SHARE of the SMs (every SM held by a waiting CTA would deadlock)."""
        return _overlap_ok((ctas,), device)

    @staticmethod
    def _args(launch, values, device, aside: bool = False, flags: bool = False,
              side: int = 0) -> list:
        """``flags``: the launch is one of an overlapped pair (its chunk-ready flags are
        live); otherwise a flag parameter gets a null pointer, which both kernels of a pair
        read as "in order: nothing to publish or wait for"."""
        args = []
        for kind, key, extra in launch.params:
            if kind is _VALUE:
                args.append(values[key] if flags or key != FLAGS_PARAM else 0)
            elif kind is _TMAP:
                args.append(tensor_map(values[key], extra, key))
            elif kind is _TMAP_BYTES:
                args.append(tensor_map_bytes(values[key], extra, key))
            else:                                   # scratch: key float32 elements
                x = torch.empty(key, dtype=torch.float32, device=device)
                if aside:       # freed when the call returns, while the side stream may run
                    x.record_stream(_side_stream(device, side))
                args.append(x)
        return args

    @staticmethod
    def _launch(launch, args, stream, profile, timed) -> None:
        if timed:
            events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            events[0].record(stream)        # None: the current stream, as the launch
        launch.kernel.launch(launch.grid, args, stream=stream)
        if timed:
            events[1].record(stream)
            if profile is not None:
                profile.append((launch.name, *events))
            for recorder in _RECORDERS:
                recorder.records.append(LaunchRecord(launch.name, launch.grid,
                                                     launch.kernel.entry, *events))


#: run a register scan beside the chunk kernel that feeds it (chunk-ready flags,
#: kdagen.codegen.lower.chunk_flags); False (or KDAGEN_OVERLAP=0) launches every kernel in
#: order on one stream (the kernels are the same: the flags are then set before the scan looks
#: at them). An ablation switch for benchmarks.
OVERLAP = os.environ.get("KDAGEN_OVERLAP", "1") != "0"
#: the side stream's priority: "high" (the default: the scan's CTAs take SMs as they free up)
#: or "default" (KDAGEN_SIDE_PRIORITY=default; an ablation: whether the priority is what
#: slows a chunk kernel beside its scan, bench/calls/stop60.sh)
SIDE_PRIORITY = os.environ.get("KDAGEN_SIDE_PRIORITY", "high")
#: the scan overlaps only while its CTAs take at most this share of the SMs: they wait for
#: chunk CTAs that need SMs of their own (every SM held by a waiting scan CTA would deadlock)
OVERLAP_SM_SHARE = 0.5

_SIDE_STREAMS: dict = {}


def _overlap_ok(grid: tuple, device) -> bool:
    if not OVERLAP or device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return math.prod(grid) <= OVERLAP_SM_SHARE * chips.sm_count(index)


def _side_stream(device, which: int = 0) -> "torch.cuda.Stream":
    """A high-priority stream per device (``which``: the k-th, for launches beside one
    another): the scan's CTAs are dispatched as soon as SMs free up, not after every CTA of
    the chunk kernel launched before them."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    s = _SIDE_STREAMS.get((index, which))
    if s is None:
        if SIDE_PRIORITY not in ("high", "default"):
            raise ValueError(f"KDAGEN_SIDE_PRIORITY={SIDE_PRIORITY!r}: use 'high' or 'default'")
        lo, hi = torch.cuda.Stream.priority_range()
        priority = hi if SIDE_PRIORITY == "high" else 0
        s = _SIDE_STREAMS[(index, which)] = torch.cuda.Stream(device=index, priority=priority)
    return s


@functools.lru_cache(maxsize=1024)
def _contiguous_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= int(d)
    return tuple(reversed(strides))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["LoweredProgram", "LaunchRecorder", "LaunchRecord", "list_variants", "eval_rule"]
