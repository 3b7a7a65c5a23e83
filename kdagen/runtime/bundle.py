"""Kernel bundles: a folder that ``kdagen emit`` writes and the runtime loads with no MLIR.

Files
-----

- ``manifest.json``: every kernel of the bundle, one entry per (kernel, chip);
- ``<kernel>.<chip>.ptx`` and, when ptxas was found, ``<kernel>.<chip>.cubin``: one per entry;
- ``lowered.json``: the lowered *programs* (kda_fwd, kda_bwd, gdn_fwd, gdn_bwd with their
  options, called variants): which kernels run in which order with which buffers. Absent for
  bundles of standalone kernels (``kdagen emit --op gate-cumsum``);
- ``README.md``: this description.

A bundle folder holds exactly what its manifest lists: emitting again into the folder
removes the kernel files of the earlier emit that the new manifest does not list (only
files kdagen wrote there: those of the earlier manifest and lowered.json; other files are
left alone). Every file is written atomically (temp file + rename, mode 0644 less the umask).

manifest.json
-------------

- ``format_version`` (1), ``kdagen_version``, ``source_hash`` (of the kdagen sources that
  emitted it), ``ptxas_version`` (null without ptxas);
- ``kernels``: a list of entries, sorted by name, then chip (sm_90a, sm_100a, sm_120a):
  - ``name``: the kernel's PTX entry name. Program kernels are ``<variant prefix>__k<i>_<label>``
    (``i``: launch order within the program); the prefix is the variant name with the tags of
    the lowering the kernel took (``native`` only on ``sm90-native`` kernels);
  - ``chip``; ``path``: the code path taken: ``sm90-native`` (TMA producer warpgroup + wgmma
    consumers), ``portable-mma`` (mma.sync + FMA), ``portable-fma``, ``portable`` (small
    global kernels);
  - ``ptx_file``, ``cubin_file`` (null without ptxas);
  - ``params``: the kernel parameters in call order, each ``{name, kind, elem}``: ``kind`` is
    ``ptr`` (a device pointer; ``elem`` its element type ``bf16``/``f16``/``f32``/``i64``, null
    for a tensor map) or a scalar type ``i32``/``f32``. Names are program arguments,
    workspaces (``*_ws``), the sizes ``T``, ``N``, ``HV``, ``scratch``, or tensor maps;
  - ``launch``: ``grid`` (three rules, see below), ``block`` ([x, y, z] threads),
    ``dynamic_shared_memory`` (bytes), ``kind`` (``tile``: one CTA per (value head, sequence,
    chunk); ``global``: a reduction over the whole tensor), ``order`` (launch order),
    ``storage`` (where tiles live: ``smem``, ``hybrid``, ``global``, ``none``),
    ``scratch_bytes_per_cta`` (the ``scratch`` parameter holds this many bytes per CTA of the
    grid), and for tile kernels ``parallel_chunks``, ``tile_bytes`` and, when the pipeline
    partitioned the program, ``hbm_bytes_per_token`` (kda-partition's count of bytes moved
    to/from global memory per token and value head; informational), ``shared_in_place``
    (true where element-wise results share their operands' tile buffers because the kernel's
    buffers spilled otherwise; informational); native kernels add
    ``path``, ``tensor_maps``, ``ring`` (``depth``, ``stage_bytes``, ``tma_loads``) and
    ``wgmma_precision``; a kernel pair that may overlap adds ``chunk_flags``: ``publish`` on
    the chunk-parallel kernel (it sets flag [chunk row, value head] of its ``chunk_flags``
    parameter, i32 [total_chunks, HV], once that chunk's stores are out) and ``wait`` on the
    state scan launched right after it (``overlaps``: the publisher's name; its TMA producer
    waits for each chunk's flag). The caller zeroes the flags before the publisher starts, and
    may launch the scan on a second stream right after the publisher (after an event, so it
    sees every earlier launch) as long as the scan's CTAs leave SMs for the publisher;
  - ``resources``: ptxas's report (``registers``, ``spill_stores``, ``spill_loads``,
    ``stack_bytes``, ``shared_bytes``), null without ptxas;
  - ``cost``: the compiler's static cost report (null when not counted): ``unit`` (``chunk
    step`` for state scans, ``CTA`` otherwise), ``per`` (whose counts: one consumer thread),
    ``counts`` (events per unit: ``global_rounds``, ``shared_rounds``, ``loop_iters``,
    ``ld.global``, ``st.global``, ``ld.shared``, ``st.shared``, ``bar.sync``,
    ``mbarrier.wait``, ``wgmma``, ``wgmma.wait``, ``ex2``, ``fma``, ...),
    ``once_per_cta`` (outside the chunk loop), ``producer``, ``unknown_trip_loops`` and
    ``estimate`` (``us``, ``us_low``, ``us_high``, ``cycles``, ``terms_us``, ``is_estimate``:
    a latency model's estimate, not a measurement). Informational: the runtime ignores it.

Launch grid rules
-----------------

Each of the three ``grid`` entries is an integer or an expression over ``T`` (tokens per
sequence row), ``B``, ``N`` (sequences: B, or len(cu_seqlens) - 1), ``H`` (q/k heads), ``HV``
(value heads), ``tokens`` (B * T), ``total_chunks`` and ``max_chunks`` (chunks of the longest
sequence: ceil(T / chunk_size)), with ``+ - * //`` and ``ceil_div(a, b)``. A grid with a zero
dimension is not launched. Tile kernels use ``[HV, N, max_chunks]`` (chunk-parallel) or
``[HV, N, 1]`` (state scans).

Tensor maps
-----------

``launch.tensor_maps`` maps a parameter name to ``{tensor, dtype, flatten, box}``: pass a
128-byte TMA descriptor (``cuTensorMapEncodeTiled``) of the program argument or workspace
``tensor`` (contiguous, 16-byte aligned), whose first ``flatten`` dimensions are merged into
rows, with the box ``box`` (outermost first), no swizzle, no interleave
(``kdagen.runtime.tensormap.device_tensor_map``).

lowered.json
------------

``{"variants": {<variant name>: {...}}}``; a variant is a program with options:

- ``program``, ``family`` (``kda``/``gdn``), ``options`` (as given to the program builder:
  ``head_k_dim``, ``head_v_dim``, ``gate``, ...), ``attrs`` (every resolved option, defaults
  included, plus ``gate_options`` and ``gate_range``), ``chunk_size``, ``gva_ratio``,
  ``varlen``;
- ``args``: the program arguments in order, each ``{name, role (input/output), layout, heads,
  dtype, tail, default}``. ``layout`` gives the leading dims: ``token`` [B, T, H or HV],
  ``state`` [N, HV], ``chunk`` [total_chunks, HV], ``head`` [HV], ``scalar`` (a float, e.g.
  ``scale``); ``heads`` says H (``qk``) or HV (``v``); ``tail`` the trailing dims;
- ``workspaces``: buffers passed between the kernels, ``{name, layout, heads, elt, tail}``
  (allocated by the launcher, same layouts); ``chip_workspaces``: the same per chip (chips
  may keep workspaces in other precisions);
- ``chips``: per chip, the kernel names (manifest entries of that chip) in launch order;
  ``kernels``: the same for the last chip (older readers);
- ``lower`` (the lowering options, e.g. ``path``, ``dot``), ``pipeline`` (``stable`` or
  ``chip``: the chip's pass pipeline).

The runtime finds a variant by ``variant_name(program, options)`` or, failing that, by
matching the requested options against ``attrs``/``options`` (head_k_dim and head_v_dim
included, so one bundle may hold several head dims).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: the kernel parameter of a pair's chunk-ready flags (launch ``chunk_flags``; written by
#: kdagen.codegen.lower.chunk_flags, filled by kdagen.runtime.launch)
FLAGS_PARAM = "chunk_flags"

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class BundleError(RuntimeError):
    pass


@dataclass
class KernelEntry:
    name: str
    chip: str
    path: str                       # which lowering path produced it ("portable", "sm90-native", ...)
    ptx_file: str
    params: list[dict]
    launch: dict
    cubin_file: str | None = None
    resources: dict | None = None
    cost: dict | None = None        # static cost report (informational; see the module doc)


@dataclass
class Manifest:
    kdagen_version: str
    source_hash: str
    ptxas_version: str | None
    kernels: list[KernelEntry] = field(default_factory=list)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        data = json.loads(text)
        if data.get("format_version") != FORMAT_VERSION:
            raise BundleError(f"manifest format {data.get('format_version')} is not supported "
                              f"(this kdagen reads format {FORMAT_VERSION}); re-emit the bundle")
        kernels = [KernelEntry(**k) for k in data.pop("kernels")]
        return cls(kernels=kernels, **data)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` through a temp file in the same folder and a rename. The file gets the
    mode of any new file (0666 less the umask, so 0644 usually)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data if isinstance(data, bytes) else data.encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 100 collisions of 48 random bits
        raise FileExistsError(f"{path}: could not create a temporary file")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


README = "README.md"
LOWERED = "lowered.json"
_README_MARK = "<!-- written by kdagen emit; rewritten on each emit -->"
_KERNEL_SUFFIXES = (".ptx", ".cubin")


def readme_text() -> str:
    """The README.md of a bundle: the schema of this module's docstring."""
    return (f"{_README_MARK}\n# kdagen kernel bundle\n\n"
            "Written by `kdagen emit` (re-check with `kdagen check DIR`).\n\n"
            + __doc__.split("\n", 2)[2].strip() + "\n")


def _plain_name(name) -> bool:
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and "\\" not in name and "\0" not in name)


def owned_files(bundle_dir: str | os.PathLike) -> set[str]:
    """Names of the files of ``bundle_dir`` that an earlier emit wrote: the .ptx/.cubin files
    its manifest lists, the ``<kernel>.<chip>.ptx/.cubin`` of the kernels its lowered.json
    lists, lowered.json, and a README.md that kdagen wrote. Unreadable files count as none."""
    out = Path(bundle_dir)
    owned: set[str] = set()
    try:
        data = json.loads((out / MANIFEST).read_text())
        for k in data.get("kernels", []):
            for key in ("ptx_file", "cubin_file"):
                owned.add(k.get(key))
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    try:
        lowered = json.loads((out / LOWERED).read_text())
        owned.add(LOWERED)
        for spec in lowered.get("variants", {}).values():
            for chip, names in (spec.get("chips") or {}).items():
                for name in names:
                    owned.update(f"{name}.{chip}{sfx}" for sfx in _KERNEL_SUFFIXES)
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    try:
        if (out / README).read_text().startswith(_README_MARK):
            owned.add(README)
    except (OSError, UnicodeDecodeError):
        pass
    return {n for n in owned if _plain_name(n)
            and (n.endswith(_KERNEL_SUFFIXES) or n in (LOWERED, README))}


class BundleFiles:
    """The files one emit writes into a bundle folder.

    ``write(name, data)`` writes atomically and records the file. ``commit()`` (after the new
    manifest is written) removes, when ``replace``, the files an earlier emit left that this
    one did not write, so that the folder holds exactly what the new manifest lists; only
    files of :func:`owned_files` are removed. Used as a context manager, a failure removes
    the files this emit wrote that no earlier manifest referred to (the old bundle stays as
    it was, less the old files rewritten with the same name)."""

    def __init__(self, bundle_dir: str | os.PathLike, replace: bool = True):
        self.dir = Path(bundle_dir)
        self.replace = replace
        self.before = owned_files(self.dir)
        self.written: set[str] = set()

    def write(self, name: str, data: bytes | str) -> None:
        write_atomic(self.dir / name, data)
        self.written.add(name)

    def write_readme(self) -> None:
        """README.md, unless the folder has a README.md that kdagen did not write."""
        path = self.dir / README
        if path.exists() and README not in self.before:
            return
        self.write(README, readme_text())

    def commit(self) -> list[str]:
        removed = []
        if self.replace:
            for name in sorted(self.before - self.written - {MANIFEST}):
                path = self.dir / name
                if path.is_file() and not path.is_symlink():
                    path.unlink()
                    removed.append(name)
        return removed

    def abort(self) -> None:
        for name in self.written - self.before - {MANIFEST}:
            try:
                (self.dir / name).unlink()
            except OSError:
                pass

    def __enter__(self) -> "BundleFiles":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def read_manifest(bundle_dir: str | os.PathLike) -> Manifest:
    path = Path(bundle_dir) / MANIFEST
    if not path.is_file():
        raise BundleError(f"{bundle_dir}: no {MANIFEST} found; emit a bundle with "
                          f"`kdagen emit -o {bundle_dir}`")
    return Manifest.from_json(path.read_text())


def variant_name(program: str, options: dict, lower: dict | None = None) -> str:
    """A readable, unique name for a program with options (K, V, C, gate, GVA, varlen, the
    matrix-product path when not the default + a hash of everything)."""
    o = dict(options)
    lower = dict(lower or {})
    K = o.get("head_k_dim", 128)
    V = o.get("head_v_dim", 128)
    C = o.get("chunk_size", 64)
    gate = o.get("gate") or ("softplus" if program.startswith("kda") else "gdn_softplus")
    parts = [program, f"K{K}V{V}C{C}", str(gate), f"r{o.get('gva_ratio', 1)}"]
    if o.get("varlen"):
        parts.append("varlen")
    if lower.get("dot", "fma") != "fma":
        parts.append(lower["dot"])
    if str(lower.get("pipeline", "")).startswith("chip"):
        parts.append("part")
    if lower.get("path", "portable") != "portable":
        parts.append(lower["path"])
    key = json.dumps([o, lower] if lower else o, sort_keys=True, default=str)
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    parts.append(digest)
    return "_".join(parts)
