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
