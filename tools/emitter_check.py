"""Run the emitter test kernels on a GPU and compare with torch (imports no MLIR).

On a machine with MLIR + ptxas:   python -m tools.testkernels OUT --arch sm_90a
On the GPU machine (torch + cuda-bindings only):   python -m tools.emitter_check OUT

For every kernel of the manifest: fresh random inputs (seeded), outputs poisoned with NaN, tensor
maps encoded with the manifest's cuTensorMapEncodeTiled arguments and copied to device memory,
one launch on torch's current stream, then the manifest's torch reference; the metric is
‖out − ref‖₂ / ‖ref‖₂ per output (``rtol`` 0 means bit-exact). Prints one line per kernel and
returns a non-zero exit status when any kernel fails.
"""
from __future__ import annotations

import json
import os
import sys

DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def _torch_dtype(name: str):
    import torch
    return getattr(torch, DTYPES[name])


def pad_rows(t, n: int):
    """Zero-pad (or keep) the first dimension of ``t`` to ``n`` rows."""
    import torch
    if t.shape[0] >= n:
        return t[:n]
    pad = torch.zeros((n - t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    return torch.cat([t, pad])


def encode_tensor_map(encode: dict, data_ptr: int):
    """cuTensorMapEncodeTiled with the manifest's arguments; returns a device uint8[128] tensor."""
    import torch

    from kdagen.runtime.tensormap import encode_on_host
    raw = encode_on_host(encode, data_ptr)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).cuda()


def _make_input(spec: dict, gen, device: str):
    import torch
    x = torch.randn(tuple(spec["shape"]), generator=gen, dtype=torch.float32)
    return x.to(_torch_dtype(spec["dtype"])).to(device)


def make_tensors(entry: dict, seed: int = 0, device: str = "cuda") -> tuple[dict, list]:
    """Inputs (seeded randn in each input's dtype), NaN-poisoned outputs and scalar values, by
    argument name; returns (tensors, output names). Tensor-map arguments are handled at launch."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    tensors, outputs = {}, []
    for spec in entry["host"]:
        tensors[spec["name"]] = _make_input(spec, gen, device)
    for spec in entry["args"]:
        if spec["kind"] == "tensor":
            if spec["output"]:
                tensors[spec["name"]] = torch.full(tuple(spec["shape"]), float("nan"),
                                                   dtype=_torch_dtype(spec["dtype"]), device=device)
                outputs.append(spec["name"])
            else:
                tensors[spec["name"]] = _make_input(spec, gen, device)
        elif spec["kind"] == "i32":
            tensors[spec["name"]] = spec["value"]
    return tensors, outputs


def reference(entry: dict, tensors: dict, outputs: list) -> dict:
    """Evaluate the manifest's reference statements on the inputs; returns the outputs."""
    import torch
    scope = {"torch": torch, "bf16": torch.bfloat16, "f16": torch.float16, "pad_rows": pad_rows}
    scope.update({k: v for k, v in tensors.items() if k not in outputs})
    exec(entry["reference"], scope)   # the manifest's own statements (written by testkernels)
    return {name: scope[name] for name in outputs}


def compare(entry: dict, got: dict, ref: dict) -> dict:
    import torch
    errors = {}
    for name, value in got.items():
        g, r = value.float(), ref[name].float()
        if g.shape != r.shape:
            errors[name] = float("inf")
        elif not torch.isfinite(g).all():
            errors[name] = float("inf")
        elif entry["rtol"] == 0:
            errors[name] = 0.0 if torch.equal(g, r) else float((g - r).abs().max())
        else:
            errors[name] = float((g - r).norm() / r.norm().clamp_min(1e-30))
    return errors


def run_kernel(module, entry: dict, seed: int = 0) -> dict:
    import torch

    from kdagen.runtime import driver
    name = entry["kernel"]
    tensors, outputs = make_tensors(entry, seed)
    kinds, values, keep = [], [], []
    for spec in entry["args"]:
        if spec["kind"] == "tensor":
            kinds.append("ptr")
            values.append(tensors[spec["name"]].data_ptr())
        elif spec["kind"] == "tensormap":
            buf = encode_tensor_map(spec["encode"], tensors[spec["of"]].data_ptr())
            keep.append(buf)
            kinds.append("ptr")
            values.append(buf.data_ptr())
        elif spec["kind"] == "i32":
            kinds.append("i32")
            values.append(spec["value"])
        else:
            raise ValueError(f"{name}: unknown argument kind {spec['kind']}")
    function = driver.get_function(module, name)
    if entry["dynamic_smem_bytes"] > 48 * 1024:
        driver.set_max_dynamic_shared(function, entry["dynamic_smem_bytes"], name)
    driver.launch(function, tuple(entry["grid"]), tuple(entry["block"]), entry["dynamic_smem_bytes"],
                  torch.cuda.current_stream().cuda_stream, kinds, values, name)
    torch.cuda.synchronize()
    errors = compare(entry, {o: tensors[o] for o in outputs}, reference(entry, tensors, outputs))
    return {"kernel": name, "ok": all(e <= entry["rtol"] for e in errors.values()), "errors": errors}


def run(out_dir: str, chip: str = "sm_90a", device: int = 0) -> list[dict]:
    from kdagen.runtime import driver
    with open(os.path.join(out_dir, "manifest.json")) as f:
        manifest = json.load(f)[chip]
    with open(os.path.join(out_dir, manifest["ptx"]), "rb") as f:
        image = f.read() + b"\0"
    driver.current_context(device)
    module = driver.load_module(image, f"emitter tests {chip}")
    results = []
    for entry in manifest["kernels"]:
        try:
            results.append(run_kernel(module, entry))
        except Exception as err:  # report and continue with the next kernel
            results.append({"kernel": entry["kernel"], "ok": False, "errors": {}, "exception": repr(err)})
    return results


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description="run the emitter test kernels against torch")
    parser.add_argument("out_dir")
    parser.add_argument("--chip", default="sm_90a")
    ns = parser.parse_args(argv)
    results = run(ns.out_dir, ns.chip)
    for r in results:
        detail = r.get("exception") or ", ".join(f"{k}={v:.2e}" for k, v in r["errors"].items())
        print(f"{'PASS' if r['ok'] else 'FAIL'}  {r['kernel']}  {detail}")
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed}/{len(results)} passed")
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
