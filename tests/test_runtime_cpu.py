"""Runtime pieces that need no GPU: chip mapping, parameter packing, bundle lookups."""
import ctypes

import pytest

from kdagen.runtime.bundle import BundleError, KernelEntry, Manifest, write_atomic
from kdagen.target import UnsupportedDeviceError, chip_for_capability
from kdagen.runtime.driver import pack_params
from kdagen.runtime.loader import KernelLibrary


def test_chip_for_capability():
    assert chip_for_capability(9, 0) == "sm_90a"
    assert chip_for_capability(10, 0) == "sm_100a"
    assert chip_for_capability(12, 0) == "sm_120a"
    with pytest.raises(UnsupportedDeviceError, match="sm_80.*sm_90"):
        chip_for_capability(8, 0, "A100")


def test_pack_params_points_at_typed_values():
    pointers, storage = pack_params(["ptr", "i32", "f32", "i64"], [0x1234, -7, 0.5, 2**40])
    assert len(pointers) == 4
    assert ctypes.c_void_p.from_address(pointers[0]).value == 0x1234
    assert ctypes.c_int32.from_address(pointers[1]).value == -7
    assert ctypes.c_float.from_address(pointers[2]).value == 0.5
    assert ctypes.c_int64.from_address(pointers[3]).value == 2**40


def _bundle(tmp_path, kernels):
    manifest = Manifest("0.1.0", "abc", None, kernels)
    write_atomic(tmp_path / "manifest.json", manifest.to_json())
    return tmp_path


def test_pack_params_passes_a_tensor_map_by_value():
    """A grid-constant tensor map (kind "tmap"): the kernel-parameter slot points at the
    map's 128 bytes themselves."""
    raw = bytes(range(128))
    ptrs, keep = pack_params(["ptr", "tmap", "i32"], [0x1000, raw, 7])
    assert ctypes.string_at(ptrs[1], 128) == raw
    assert ctypes.c_int32.from_address(ptrs[2]).value == 7


def test_library_lookup_names_missing_kernel(tmp_path):
    entry = KernelEntry("k1", "sm_90a", "portable", "k1.ptx", [], {"block": [1, 1, 1]})
    lib = KernelLibrary(_bundle(tmp_path, [entry]))
    assert lib.entry("k1", "sm_90a") is lib.manifest.kernels[0]
    with pytest.raises(BundleError, match="no kernel k1 for sm_120a.*kdagen emit --arch sm_120a"):
        lib.entry("k1", "sm_120a")


def test_manifest_round_trip_and_version_check(tmp_path):
    entry = KernelEntry("k1", "sm_90a", "portable", "k1.ptx", [{"name": "x", "kind": "ptr"}],
                        {"block": [128, 1, 1]}, resources={"registers": 3})
    text = Manifest("0.1.0", "abc", "13.0", [entry]).to_json()
    back = Manifest.from_json(text)
    assert back.kernels[0] == entry and back.ptxas_version == "13.0"
    with pytest.raises(BundleError, match="re-emit"):
        Manifest.from_json(text.replace('"format_version": 1', '"format_version": 99'))


def test_library_without_manifest(tmp_path):
    with pytest.raises(BundleError, match="kdagen emit"):
        KernelLibrary(tmp_path)


class _RecordingKernel:
    """A LoadedKernel stand-in: records each launch's grid and arguments."""

    def __init__(self, entry):
        self.entry = entry
        self.launches = []

    def launch(self, grid, args, stream=None):
        self.launches.append((tuple(grid), list(args)))


def test_launch_plan_follows_the_sizes_and_fills_each_call_fresh(tmp_path, monkeypatch):
    """The launcher works out grids, scratch sizes and parameter kinds once per call size
    (LoweredProgram._plan) and must still give every call its own tensors: a second size gets
    its own grid and scratch, a new input its own tensor map."""
    import json

    import torch

    from kdagen.runtime import launch as L, tensormap
    from kdagen.runtime.bundle import KernelEntry
    monkeypatch.setattr(tensormap, "encode_on_host",
                        lambda args, ptr: ptr.to_bytes(8, "little") + bytes(120))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    args = [dict(name="q", role="input", layout="token", heads="v", dtype="bf16", tail=[128]),
            dict(name="o", role="output", layout="token", heads="v", dtype="bf16", tail=[128]),
            dict(name="scale", role="input", layout="scalar", default=0.5)]
    workspaces = [dict(name="ws_a", layout="chunk", tail=[64, 128], elt="f32"),
                  dict(name="ws_b", layout="chunk", tail=[3], elt="bf16"),
                  dict(name="ws_c", layout="head", tail=[128], elt="f32")]
    (tmp_path / L.LOWERED).write_text(json.dumps({"variants": {"v": dict(
        program="p", args=args, workspaces=workspaces, kernels=["kern"], chips={},
        chunk_size=64, gva_ratio=1)}}))
    entry = KernelEntry("kern", "sm_90a", "sm90-native", "kern.ptx",
                        params=[{"name": n, "kind": k} for n, k in
                                (("q_map", "ptr"), ("o", "ptr"), ("T", "i32"), ("scale", "f32"),
                                 ("scratch", "ptr"), ("q_bytes", "tmap"), ("ws_a", "ptr"),
                                 ("ws_b", "ptr"), ("ws_c", "ptr"))],
                        launch={"grid": ["ceil_div(T, 64)", "HV", 1], "block": [128, 1, 1],
                                "scratch_bytes_per_cta": 16, "tensor_maps": {
                                    m: dict(tensor="q", dtype="bf16", flatten=3, box=[64, 128])
                                    for m in ("q_map", "q_bytes")}})
    kern = _RecordingKernel(entry)

    class Library:
        def get(self, name, device):
            assert name == "kern"
            return kern

    prog = L.LoweredProgram(tmp_path, "v", library=Library())
    start = tensormap.counts()
    q1 = torch.randn(1, 64, 2, 128).bfloat16()
    q2 = torch.randn(1, 200, 2, 128).bfloat16()
    prog(chip="sm_90a", q=q1)
    prog(chip="sm_90a", q=q2, scale=2.0)
    prog(chip="sm_90a", q=q1.clone())
    (g1, a1), (g2, a2), (g3, a3) = kern.launches
    assert g1 == (1, 2, 1) and g2 == (4, 2, 1) and g3 == g1
    assert [a[3] for a in (a1, a2, a3)] == [0.5, 2.0, 0.5] and [a[2] for a in (a1, a2)] == [64, 200]
    assert a1[4].numel() == 1 * 2 * 16 // 4 and a2[4].numel() == 4 * 2 * 16 // 4   # scratch
    # each map encodes its own tensor's address: a new tensor is never served an old map
    encoded = [int.from_bytes(bytes(a[0][:8].tolist()), "little") for a in (a1, a2, a3)]
    assert len(set(encoded)) == 3 and a3[1].shape == (1, 64, 2, 128)
    # a "tmap" parameter gets the same map's bytes (nothing copied to the device)
    assert [int.from_bytes(a[5][:8], "little") for a in (a1, a2, a3)] == encoded
    assert all(isinstance(a[5], bytes) and len(a[5]) == 128 for a in (a1, a2, a3))
    # the workspaces: one allocation per call, each piece 256-byte aligned, none overlapping,
    # of the manifest's shape and type (chunk rows: B * ceil(T / 64))
    for a, rows in ((a1, 1), (a2, 4)):
        ws = a[6:9]
        assert [w.shape for w in ws] == [(rows, 2, 64, 128), (rows, 2, 3), (2, 128)]
        assert [w.dtype for w in ws] == [torch.float32, torch.bfloat16, torch.float32]
        spans = sorted((w.data_ptr(), w.data_ptr() + w.numel() * w.element_size()) for w in ws)
        base = ws[0].untyped_storage().data_ptr()     # CUDA blocks: 512-byte aligned
        assert all((start - base) % 256 == 0 for start, _ in spans) and base % 16 == 0
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
        assert ws[0].untyped_storage().data_ptr() == ws[2].untyped_storage().data_ptr()
    end = tensormap.counts()   # three addresses: three maps, each encoded once for both kinds
    assert (end["encoded"] - start["encoded"], end["copied"] - start["copied"]) == (3, 3)
    prog(chip="sm_90a", q=q1)                 # an address seen before: nothing new made
    assert tensormap.counts() == end


def test_a_param_pack_is_refilled_in_place_with_each_launchs_values():
    """driver.ParamPack: one kernel's parameter array, built once; each fill writes the
    launch's values where the array points (a tensor map's 128 bytes by value) and returns
    the same array."""
    from kdagen.runtime.driver import ParamPack
    pack = ParamPack(["ptr", "tmap", "i32", "f32", "i64"])
    raw = bytes(range(128))
    first = pack.fill([0x1000, raw, 7, 0.5, 2**40])
    ptrs = (ctypes.c_void_p * 5).from_address(first)
    assert ctypes.c_void_p.from_address(ptrs[0]).value == 0x1000
    assert ctypes.string_at(ptrs[1], 128) == raw
    assert ctypes.c_int32.from_address(ptrs[2]).value == 7
    assert ctypes.c_float.from_address(ptrs[3]).value == 0.5
    assert ctypes.c_int64.from_address(ptrs[4]).value == 2**40
    again = pack.fill([0, bytes(128), -3, -1.25, 5])      # the next launch's values, in place
    assert again == first
    assert ctypes.c_void_p.from_address(ptrs[0]).value is None      # a null pointer
    assert ctypes.string_at(ptrs[1], 128) == bytes(128)
    assert ctypes.c_int32.from_address(ptrs[2]).value == -3
    assert ctypes.c_float.from_address(ptrs[3]).value == -1.25
    assert ctypes.c_int64.from_address(ptrs[4]).value == 5


def test_workspaces_are_disjoint_typed_views_of_one_arena():
    """LoweredProgram._workspaces: each workspace a contiguous view of its shape and type at
    its offset of one allocation (the flags zeroed, floats NaN when poisoned); writing one
    leaves the others alone."""
    import torch

    from kdagen.runtime.launch import FLAGS_PARAM, LoweredProgram, _CallPlan
    pieces = [("a", (3, 4, 5), torch.float32, 0, 240), ("b", (7,), torch.int64, 256, 56),
              (FLAGS_PARAM, (2, 3), torch.int32, 512, 24), ("c", (2, 2), torch.float32, 768, 16)]
    plan = _CallPlan((), tuple(pieces), 1024)
    out = LoweredProgram._workspaces(plan, torch.device("cpu"), poison=True)
    base = out["a"].untyped_storage().data_ptr()
    for name, shape, dtype, offset, _ in pieces:
        x = out[name]
        assert x.shape == shape and x.dtype == dtype and x.is_contiguous()
        assert x.data_ptr() - base == offset
    assert bool((out[FLAGS_PARAM] == 0).all())
    assert bool(out["a"].isnan().all()) and bool(out["c"].isnan().all())
    out["a"].fill_(1.0)
    out["b"].fill_(-1)
    assert bool(out["c"].isnan().all()) and bool((out[FLAGS_PARAM] == 0).all())
