"""What an assembled kernel executes, read from its SASS (``nvdisasm``): the instruction count
and mix per kernel.

The lowering's static count (kdagen.codegen.lower.cost) counts the operations it emits; ptxas
then adds what they expand to — address arithmetic, bf16 packing and unpacking, predicates,
the multi-instruction sequences of a correctly rounded division or square root. For the
register-tile kernels (fully unrolled: the SASS listing is what each thread executes, once)
the static count was 1.6-3.1x below the SASS count: gdn_bwd's dq kernel on register tiles
counted 2810 instructions per thread and assembles to 8136, most of the difference the bf16
hi/lo splits of its bf16x3 products (F2FP, LOP3, IMAD.U32, FADD per element). The SASS count
is the better predictor there (kdagen.codegen.lower.cost_model.SASS_NS_PER_INSTRUCTION).

nvdisasm comes with the CUDA toolkit and in the ``nvidia-cuda-nvdisasm`` wheel (the
``kdagen[compiler]`` extra installs it on x86-64 Linux); without it the mix is not reported.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

__all__ = ["find_nvdisasm", "instruction_mix", "parse_sass", "CLASSES", "classify",
           "format_mix"]

#: instruction classes of the mix, by opcode (the part before the first '.'), first match wins
CLASSES = (
    ("tensor", ("HGMMA", "HMMA", "IMMA", "UTCHMMA", "UTCQMMA", "WARPGROUP")),
    ("shared", ("LDS", "STS", "LDSM", "STSM", "ATOMS")),
    ("global", ("LDG", "STG", "LD", "ST", "RED", "ATOMG", "LDL", "STL", "UTMALDG", "UTMASTG",
                "UBLKCP", "UTMAPF", "CCTL")),
    ("fp32", ("FADD", "FMUL", "FFMA", "FSEL", "FSETP", "FMNMX", "FCHK", "FRND", "FSET")),
    ("sfu", ("MUFU",)),
    ("convert", ("F2F", "F2FP", "F2I", "I2F", "I2FP", "F2IP")),
    ("sync", ("BAR", "SYNCS", "MEMBAR", "DEPBAR", "WARPSYNC", "ERRBAR", "FENCE")),
    ("control", ("BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "NOP", "YIELD", "BPT",
                 "WARPGROUP_ARRIVE")),
    ("shuffle", ("SHFL", "VOTE", "VOTEU", "MATCH", "REDUX")),
)

_LINE = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", re.M)
# a kernel's code: cuobjdump -sass's "Function : NAME", nvdisasm's ".text.NAME:" label; its
# listing ends at the next kernel or section
_FUNCTION = re.compile(r"^\s*(?:Function : (\S+)|\.text\.(\S+):)\s*$", re.M)
_SECTION = re.compile(r"^\s*\.section\b", re.M)


def find_nvdisasm() -> str | None:
    """$KDAGEN_NVDISASM, PATH, the CUDA install folders, then the nvidia-cuda-nvdisasm
    wheel's copy; None where there is none."""
    candidates = [os.environ.get("KDAGEN_NVDISASM"), shutil.which("nvdisasm"),
                  "/usr/local/cuda/bin/nvdisasm"]
    for site in sys.path:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "bin", "nvdisasm")))
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_nvdisasm", "bin",
                                                    "nvdisasm")))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def classify(opcode: str) -> str:
    """The class of an SASS opcode (``LOP3.LUT`` -> its base ``LOP3``): one of CLASSES' names,
    ``uniform`` for the uniform datapath (U*, R2UR, S2UR), else ``integer``."""
    base = opcode.split(".")[0]
    for name, ops in CLASSES:
        if base in ops:
            return name
    if base.startswith("U") or base in ("R2UR", "S2UR"):
        return "uniform"
    return "integer"


def parse_sass(text: str) -> dict[str, collections.Counter]:
    """``nvdisasm`` (or ``cuobjdump -sass``) text -> {kernel: Counter of opcodes}
    (predicates dropped)."""
    out: dict[str, collections.Counter] = {}
    starts = [(m.end(), m.group(1) or m.group(2)) for m in _FUNCTION.finditer(text)]
    for i, (at, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        section = _SECTION.search(text, at, end)
        end = section.start() if section else end
        ops = collections.Counter()
        for ins in _LINE.findall(text, at, end):
            words = ins.split()
            if words and words[0].startswith("@"):
                words = words[1:]
            if words:
                ops[words[0]] += 1
        out[name] = ops
    return out


def instruction_mix(cubin: bytes, nvdisasm: str | None = None) -> dict[str, dict] | None:
    """{kernel: {"instructions": n, "classes": {class: n}, "opcodes": Counter}} of a cubin's
    SASS; None without nvdisasm or where it fails."""
    exe = nvdisasm or find_nvdisasm()
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="kdagen-sass-") as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        proc = subprocess.run([exe, path], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    out = {}
    for name, ops in parse_sass(proc.stdout).items():
        classes = collections.Counter()
        for op, n in ops.items():
            classes[classify(op)] += n
        out[name] = {"instructions": sum(ops.values()), "classes": dict(classes.most_common()),
                     "opcodes": ops}
    return out


def format_mix(mix: dict, top: int = 8) -> str:
    """One kernel's mix as two comment lines."""
    classes = ", ".join(f"{k} {v}" for k, v in mix["classes"].items())
    ops = ", ".join(f"{k} {v}" for k, v in mix["opcodes"].most_common(top))
    return (f"// SASS (nvdisasm): {mix['instructions']} instructions: {classes}\n"
            f"//   most frequent: {ops}\n")
