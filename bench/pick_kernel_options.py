"""Per-kernel winners of a lowering-option A/B, as candidate entries of the tuning table.

    # here: one bundle per global option value (bench/emit_bench_bundle.py --load-batch 2 ...)
    # GPU:  kdagen bench --bundle base=DIR --bundle lb2=DIR2 ... --kernels --json ab.json
    python bench/pick_kernel_options.py ab.json --baseline base --options lb2=load_batch=2

Each kernel launch of the bench JSON's per-kernel table (``kdagen bench --kernels``) is
matched across the implementations by (program, K, V, kernel) -- the program and head dims
come from the kernel's variant name (``kda_bwd_K128V128C64_...__k4_scan4``). A kernel whose
fastest implementation beats the baseline by at least ``--min-gain`` percent becomes a
candidate `kdagen.codegen.lower.tuning.TunedKernel` line, printed with its measurement (the
options of each implementation label come from ``--options``; a bundle emitted with the
tuning table on also carries its entries, which ``--options`` should then name). The lines
take ``--path`` (the chunk kernels' sm90-native by default). Prints a table and the lines;
writes nothing. The choice stays a measurement: a kernel seen once per mode is taken at its
median over the bench's --kernel-reps calls, a kernel seen in several modes at its slowest.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

_NAME = re.compile(r"^(?P<program>[a-z]+_[a-z]+)_K(?P<K>\d+)V(?P<V>\d+)C\d+_.*__(?P<kernel>k\d+_\w+)$")


def kernel_key(name: str):
    """(program, (K, V), kernel label) of a kernel's full name, None where it does not parse."""
    m = _NAME.match(name)
    if m is None:
        return None
    return m["program"], (int(m["K"]), int(m["V"])), m["kernel"]


def kernel_times(rows: list, impl_prefix: str = "kdagen_") -> dict:
    """{(program, dims, kernel): {impl label: us}} over the rows of ``kdagen bench --kernels``
    (a kernel timed in several modes keeps its slowest median)."""
    out: dict = {}
    for r in rows:
        key = kernel_key(r.get("kernel", ""))
        if key is None or not r.get("impl", "").startswith(impl_prefix):
            continue
        label = r["impl"][len(impl_prefix):]
        per = out.setdefault(key, {})
        per[label] = max(per.get(label, 0.0), float(r["us"]))
    return out


def winners(times: dict, baseline: str, min_gain: float, min_us: float = 20.0) -> list[dict]:
    """Kernels whose fastest label beats ``baseline`` by ``min_gain`` percent or more
    (kernels under ``min_us`` at the baseline are left out: a few-us launch's differences
    are noise)."""
    found = []
    for key, per in sorted(times.items()):
        if baseline not in per or per[baseline] < min_us:
            continue
        label = min(per, key=per.get)
        gain = 100.0 * (per[baseline] - per[label]) / per[baseline]
        if label != baseline and gain >= min_gain:
            found.append(dict(program=key[0], head_dims=key[1], kernel=key[2], label=label,
                              baseline_us=per[baseline], us=per[label], gain_pct=gain))
    return found


def parse_options(items: list[str]) -> dict:
    """``label=name=value`` (repeatable, several per label with commas:
    ``lb2=load_batch=2,remat_ops=0``) -> {label: ((name, value), ...)}."""
    out = {}
    for item in items:
        label, _, rest = item.partition("=")
        pairs = []
        for part in rest.split(","):
            name, _, value = part.partition("=")
            if not name or not value:
                raise ValueError(f"--options {item!r}: expected LABEL=NAME=VALUE[,NAME=VALUE]")
            pairs.append((name, int(value) if value.lstrip("-").isdigit() else value))
        out[label] = tuple(pairs)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="kdagen bench --kernels --json output")
    ap.add_argument("--baseline", required=True, help="the implementation label of the defaults")
    ap.add_argument("--options", action="append", default=[], metavar="LABEL=NAME=VALUE",
                    help="the lowering options of an implementation label (repeatable)")
    ap.add_argument("--min-gain", type=float, default=3.0, metavar="PCT")
    ap.add_argument("--min-us", type=float, default=20.0, metavar="US",
                    help="leave out kernels faster than this at the baseline (noise)")
    ap.add_argument("--chip", default="sm_90a")
    ap.add_argument("--path", default="sm90-native")
    args = ap.parse_args(argv)
    data = json.load(open(args.json))
    times = kernel_times(data.get("kernels") or [])
    if not times:
        print(f"{args.json}: no per-kernel rows (run kdagen bench with --kernels)",
              file=sys.stderr)
        return 2
    labels = sorted({label for per in times.values() for label in per})
    print(f"{'program':10s} {'K,V':8s} {'kernel':18s} " + " ".join(f"{lb:>10s}" for lb in labels))
    for (program, dims, kernel), per in sorted(times.items()):
        print(f"{program:10s} {dims[0]},{dims[1]:<5d} {kernel:18s} "
              + " ".join(f"{per[lb]:10.1f}" if lb in per else f"{'-':>10s}" for lb in labels))
    options = parse_options(args.options)
    device = data.get("device", "?")
    print(f"\ncandidates (>= {args.min_gain:g}% faster than {args.baseline}):")
    for w in winners(times, args.baseline, args.min_gain, args.min_us):
        opts = options.get(w["label"])
        evidence = (f"{device}: {w['baseline_us']:.0f} -> {w['us']:.0f} us "
                    f"({args.json})")
        print(f"    TunedKernel({args.chip!r}, {args.path!r}, {w['program']!r}, "
              f"{tuple(w['head_dims'])!r}, {w['kernel']!r}, "
              f"{opts if opts is not None else '<options of ' + w['label'] + '>'}, "
              f"{evidence!r}),   # -{w['gain_pct']:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
