"""Host time of a kdagen call per layer, inclusive, without a profiler's distortion: each named
function is wrapped by a timer (about a microsecond each), the call is run many times, and the
time spent inside each function is printed per call. cProfile double-counts across torch's C++
dispatcher (its backend_impl's "own" time holds our kernels' launch path); this does not.

    python3 bench/host_layers.py --bundle DIR --op gdn --mode fwd [--calls 200] [--json out]

Layers: the API function, its validation, the torch custom op, the program run, the launcher's
bind / plan / arguments / launches, tensor maps, the driver launch, the backward as a whole.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import os
import sys
import time

#: (module, qualified name) of each layer timed
LAYERS = (
    ("kdagen.api", "chunk_gated_delta_rule"),
    ("kdagen.api", "chunk_kda"),
    ("kdagen.api", "_call"),
    ("kdagen.validation", "validate_inputs"),
    ("kdagen.ops", "_run_program"),
    ("kdagen.runtime.bundle_executor", "launch_bundle"),
    ("kdagen.runtime.launch", "LoweredProgram.__call__"),
    ("kdagen.runtime.launch", "LoweredProgram.bind"),
    ("kdagen.runtime.launch", "LoweredProgram.prepare_launches"),
    ("kdagen.runtime.launch", "LoweredProgram._workspaces"),
    ("kdagen.runtime.launch", "LoweredProgram.run_launches"),
    ("kdagen.runtime.launch", "LoweredProgram._args"),
    ("kdagen.runtime.launch", "LoweredProgram._launch"),
    ("kdagen.runtime.tensormap", "tensor_map"),
    ("kdagen.runtime.loader", "LoadedKernel.launch"),
    ("kdagen.runtime.driver", "launch"),
    ("kdagen.runtime.driver", "pack_params"),
    ("torch.autograd", "backward"),
)

_TOTALS: dict = {}
_COUNTS: dict = {}


def _timed(label, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _TOTALS[label] = _TOTALS.get(label, 0.0) + time.perf_counter() - start
            _COUNTS[label] = _COUNTS.get(label, 0) + 1
    return wrapper


def wrap_layers(layers=LAYERS) -> list[str]:
    """Wrap each layer (in its module, in its class, and wherever a kdagen module imported the
    function by name); the labels wrapped."""
    done = []
    for module_name, qualname in layers:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        owner, _, attr = qualname.rpartition(".")
        holder = getattr(module, owner) if owner else module
        original = getattr(holder, attr, None)
        if original is None:
            continue
        label = f"{module_name}:{qualname}"
        wrapped = _timed(label, original)
        static = owner and isinstance(inspect.getattr_static(holder, attr), staticmethod)
        setattr(holder, attr, staticmethod(wrapped) if static else wrapped)
        if not owner:
            for name, mod in list(sys.modules.items()):
                if name.startswith("kdagen") and mod is not None:
                    for key, value in list(vars(mod).items()):
                        if value is original:
                            setattr(mod, key, wrapped)
        done.append(label)
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--op", default="gdn", choices=["kda", "gdn"])
    ap.add_argument("--mode", default="fwd", choices=["fwd", "fwdbwd"])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    os.environ["KDAGEN_BUNDLE"] = a.bundle
    import torch

    import kdagen  # noqa: F401  (registers the ops before the layers are wrapped)
    assert kdagen
    from kdagen.benchmark import call, host_enqueue_ms, implementations, make_inputs
    x, kw, _ = make_inputs(a.op, 1, 8192, 16, 16, None, "cuda")
    grad = a.mode == "fwdbwd"
    fn = implementations(a.op, fla=False)["kdagen"]

    def one_call():
        with torch.set_grad_enabled(grad):
            call(fn, a.op, x, kw, grad)

    for _ in range(5):
        one_call()
    torch.cuda.synchronize()
    bare = host_enqueue_ms(one_call, reps=50)
    labels = wrap_layers()
    fn = implementations(a.op, fla=False)["kdagen"]      # after wrapping: the wrapped API
    for _ in range(3):
        one_call()
    torch.cuda.synchronize()
    wrapped = host_enqueue_ms(one_call, reps=50)
    _TOTALS.clear()
    _COUNTS.clear()
    start = time.perf_counter()
    for i in range(a.calls):
        one_call()
        if i % 10 == 9:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / a.calls
    print(f"{a.op} {a.mode} on {torch.cuda.get_device_name()}: host enqueue {bare:.3f} ms "
          f"per call unwrapped, {wrapped:.3f} wrapped (median of 50); {1e3 * wall:.3f} ms per "
          "call in the timed loop (a synchronize every 10 calls)")
    print(f"{'us per call':>12} {'calls':>7}  layer (inclusive)")
    rows = []
    for label in labels:
        if label in _TOTALS:
            us = 1e6 * _TOTALS[label] / a.calls
            n = _COUNTS[label] / a.calls
            rows.append({"layer": label, "us_per_call": us, "calls_per_call": n})
            print(f"{us:12.1f} {n:7.1f}  {label}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"op": a.op, "mode": a.mode, "enqueue_ms": bare,
                       "enqueue_wrapped_ms": wrapped, "layers": rows,
                       "device": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
