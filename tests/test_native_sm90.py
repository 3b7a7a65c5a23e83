"""The sm_90a native path of the program lowering (kdagen.codegen.lower.sm90_native) and its host
side (kdagen.runtime.tensormap): what is TMA'd, the manifest contract, the tensor-map
arguments. The PTX contents of every op x head dim are checked by test_cli's emit test; the
numerics run on the GPU (tools.gpu_check with the NATIVE_SET bundle)."""
from __future__ import annotations

import pytest

from conftest import HAS_PTXAS

from kdagen.runtime.tensormap import TensorMapError, encode_args, map_shape


def test_map_shape_flattens_leading_dims():
    assert map_shape((2, 100, 4, 128), 2) == (200, 4, 128)
    assert map_shape((7, 16, 64, 128), 2) == (112, 64, 128)


def test_encode_args_token_box():
    args = encode_args((200, 4, 128), "bf16", (64, 1, 128))
    assert args["tensorRank"] == 3
    assert args["globalDim"] == [128, 4, 200]            # innermost first
    assert args["globalStrides"] == [256, 1024]          # bytes of dims 1, 2 (innermost first)
    assert args["boxDim"] == [128, 1, 64]
    assert args["swizzle"] == "CU_TENSOR_MAP_SWIZZLE_NONE"
    assert args["oobFill"] == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"   # rows past the end read 0


@pytest.mark.parametrize("shape,dtype,box,needle", [
    ((10, 4, 3), "bf16", (8, 1, 3), "multiple of 16"),      # 6-byte box rows
    ((10, 3), "bf16", (8, 8), "strides"),                   # 6-byte rows: bad strides
    ((10, 4), "bf16", (8, 1, 4), "rank"),
])
def test_encode_args_rejects_what_tma_cannot_do(shape, dtype, box, needle):
    with pytest.raises(TensorMapError, match=needle):
        encode_args(shape, dtype, box)


@pytest.fixture(scope="module")
def kda_fwd_native():
    pytest.importorskip("kdagen._mlir")
    from kdagen.driver import build_module
    from kdagen.codegen.lower.kernel import LowerOptions, prepare
    from kdagen.codegen.lower.program import read_program
    from kdagen.target import get_target
    module = build_module("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="lower_bound"),
                                  "chip", "sm_90a")
    program = read_program(module)
    opts = LowerOptions(path="native", dot="bf16x3")
    return program, prepare(program, get_target("sm_90a"), "t", opts)


def test_native_plan_tmas_the_chunk_tiles(kda_fwd_native):
    program, kernels = kda_fwd_native
    chunk = kernels[0]
    launch = chunk.launch
    # two consumer warpgroups (chunk_warpgroups "auto": the tile buffers fit in shared
    # memory) and the producer
    assert launch["storage"] == "smem"
    assert launch["path"] == "sm90-native" and launch["block"] == [384, 1, 1]
    # q, k, v, g_raw are [C, 64] bf16 boxes; beta (2 bytes per token) stays a global load
    assert sorted(launch["ring"]["tma_loads"]) == ["g_raw", "k", "v"]     # q is read by the out kernel only
    maps = launch["tensor_maps"]
    assert maps["k_tmap"] == {"tensor": "k", "dtype": "bf16", "flatten": 2, "box": [64, 1, 64]}
    params = [p.name for p in chunk.emitter.params()]
    assert all(name in params for name in maps)
    # the ring, staging and barriers fit in the chip's shared memory
    assert launch["dynamic_shared_memory"] <= 227 * 1024
    state = kernels[1]
    assert state.launch["tensor_maps"], "the state kernel streams its chunk workspaces with TMA"
    for m in state.launch["tensor_maps"].values():
        token = m["tensor"] in {a.name for a in program.args}
        # token tensors: one chunk of rows of one head; workspaces: one (chunk, head) row
        assert m["box"] == [64, 1, 64] if token else m["box"][0] == 1, m


def test_portable_chips_do_not_take_the_native_path(kda_fwd_native):
    from kdagen.codegen.lower.kernel import LowerOptions, prepare
    from kdagen.target import get_target
    program, _ = kda_fwd_native
    for chip in ("sm_100a", "sm_120a"):
        for k in prepare(program, get_target(chip), "t", LowerOptions(path="native", dot="bf16x3")):
            assert "path" not in k.launch and k.launch["block"][0] == 128


def test_unknown_path_is_an_actionable_error(kda_fwd_native):
    from kdagen.codegen.lower.kernel import LowerOptions, prepare
    from kdagen.codegen.lower.plan import LoweringError
    from kdagen.target import get_target
    program, _ = kda_fwd_native
    with pytest.raises(LoweringError, match="'portable' or 'native'"):
        prepare(program, get_target("sm_90a"), "t", LowerOptions(path="fast"))


def test_native_emitter_refuses_other_chips(kda_fwd_native):
    from kdagen.codegen.lower.sm90_native import NativeLayout, Sm90NativeTileEmitter
    from kdagen.codegen.lower.kernel import LowerOptions
    from kdagen.target import get_target
    program, kernels = kda_fwd_native
    pk = kernels[0]
    with pytest.raises(ValueError, match="sm_90a"):
        Sm90NativeTileEmitter(program, pk.group, pk.plan, pk.storage, LowerOptions(),
                              get_target("sm_120a"), NativeLayout())


@pytest.mark.parametrize("warpgroups,threads,regs,n_split", [(2, 384, 232, 32), (4, 640, 112, 16)])
def test_consumer_warpgroups_split_every_wgmma_over_n(warpgroups, threads, regs, n_split):
    """chunk_warpgroups=W: chunk-parallel kernels launch 128 (W + 1) threads (W consumer
    warpgroups + the producer), the tile loops stride over 128 W threads, each warpgroup issues
    wgmma on N / W columns (n32 / n16 for the [64, 64] products of K = V = 64), the consumers
    claim what the producer gives back within the entry budget (register_split), and ptxas
    assembles it without spills; the serial scan keeps its own layout."""
    pytest.importorskip("kdagen._mlir")
    import re

    from kdagen.codegen.lower.sm90_native import register_split
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    producer, consumer = register_split(warpgroups)
    assert consumer == regs
    entry = min(255, 65536 // threads) // 8 * 8
    assert 128 * producer + 128 * warpgroups * consumer <= entry * threads
    c = Compilation("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="lower_bound"), "sm_90a",
                    lower=dict(DEFAULT_LOWERING, chunk_warpgroups=warpgroups)).run("ptx")
    chunk = next(k for k in c.kernels if k.launch.get("parallel_chunks"))
    scan = next(k for k in c.kernels if k.launch.get("kind") == "tile"
                and not k.launch.get("parallel_chunks"))
    assert chunk.launch["block"] == [threads, 1, 1] and scan.launch["block"] == [256, 1, 1]
    ptx = c.ptx[chunk.name]
    assert f".maxntid {threads}, 1, 1" in ptx
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{regs}", ptx)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{producer}", ptx)
    assert re.search(rf"bar\.sync\s+1, {128 * warpgroups}", ptx)      # the consumers' named barrier
    # the forward's products are TF32 (dot="auto"): k8 per instruction
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k\d+)", ptx))
    assert shapes == {f"m64n{n_split}k8"}, shapes
    from kdagen.codegen import ptxas
    try:
        ptxas.find_ptxas()
    except ptxas.PtxasNotFound:
        pytest.skip("ptxas not found")
    res = ptxas.assemble(ptx, "sm_90a")
    assert res.ok, res.log
    (r,) = [v for k, v in res.resources.items() if k == chunk.name]
    assert r.spills == 0 and r.registers <= entry, res.log


def test_chunk_warpgroups_out_of_range_is_an_actionable_error():
    pytest.importorskip("kdagen._mlir")
    from kdagen.codegen.lower.plan import LoweringError
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    with pytest.raises(LoweringError, match="chunk_warpgroups=3: .* 1, 2, 4 or 'auto'"):
        Compilation("kda_fwd", dict(head_k_dim=64, head_v_dim=64), "sm_90a",
                    lower=dict(DEFAULT_LOWERING, chunk_warpgroups=3)).run("gpu")


def test_auto_warpgroups_follow_the_storage():
    """chunk_warpgroups "auto": 4 consumer warpgroups for a chunk-parallel kernel whose tile
    buffers spill to the global scratch (the forward's output kernel, the backward's chunk
    kernels at K = V = 128) or fit only with results sharing their operands' buffers (the
    backward's dq kernel), 2 for one that fits in shared memory (the forward's prologue);
    serial scans keep one."""
    pytest.importorskip("kdagen._mlir")
    from kdagen.codegen.lower.sm90_native import chunk_warpgroups
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    assert chunk_warpgroups("auto", "hybrid") == 4 and chunk_warpgroups("auto", "smem") == 2
    assert chunk_warpgroups(1, "hybrid") == 1
    kernels = [k for program in ("kda_fwd", "kda_bwd")
               for k in Compilation(program, dict(head_k_dim=128, head_v_dim=128), "sm_90a",
                                    lower=DEFAULT_LOWERING).run("gpu").kernels]
    seen, in_place = set(), set()
    for k in kernels:
        if k.launch.get("path") != "sm90-native" or not k.launch.get("parallel_chunks"):
            continue
        # a kernel whose buffers fit only by sharing in place keeps its spilling plan's 4
        spilled = k.launch["storage"] in ("hybrid", "global") or k.launch.get("shared_in_place")
        want = 640 if spilled else 384
        assert k.launch["block"] == [want, 1, 1], (k.name, k.launch["storage"])
        seen.add(want)
        in_place.add(bool(k.launch.get("shared_in_place")))
    assert seen == {384, 640} and in_place == {False, True}


def test_check_bundle_parses_lowering_options_by_type():
    """tools/check_bundle.py --lower KEY=VALUE: a number for an option whose default is a word
    (chunk_warpgroups "auto") stays a number, so ``--lower chunk_warpgroups=2`` is the 2 the
    lowering accepts."""
    from tools.check_bundle import _lower_option
    assert _lower_option("chunk_warpgroups=2") == ("chunk_warpgroups", 2)
    assert _lower_option("chunk_warpgroups=auto") == ("chunk_warpgroups", "auto")
    assert _lower_option("tril_inv=columns") == ("tril_inv", "columns")
    assert _lower_option("load_batch=4") == ("load_batch", 4)
    assert _lower_option("register_scan=false") == ("register_scan", False)


def test_kernels_are_sized_for_the_ctas_their_shared_memory_allows():
    """ctas_per_sm: one CTA per SM for ~220 KB kernels, three for a decode kernel holding one
    state; the register split stays within 65536 / (threads x CTAs) and the PTX says so."""
    pytest.importorskip("kdagen._mlir")
    import re

    from kdagen.codegen.lower.sm90_native import ctas_per_sm, register_split
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    from kdagen.target import get_target
    h200 = get_target("sm_90a")
    assert (ctas_per_sm(224272, h200), ctas_per_sm(71712, h200), ctas_per_sm(1024, h200)) == \
        (1, 3, 4)
    for warpgroups, ctas in ((1, 1), (2, 1), (4, 1), (1, 2), (1, 3), (1, 4)):
        producer, consumer = register_split(warpgroups, ctas)
        threads = 128 * (warpgroups + 1)
        entry = min(255, 65536 // (threads * ctas)) // 8 * 8
        assert 128 * producer + 128 * warpgroups * consumer <= entry * threads
        assert 24 <= producer <= consumer and consumer % 8 == 0
    c = Compilation("kda_decode", dict(head_k_dim=128, head_v_dim=128), "sm_90a",
                    lower=DEFAULT_LOWERING).run("ptx")
    (k,) = c.kernels
    ptx = c.ptx[k.name]
    assert ".minnctapersm 3" in ptx
    producer, consumer = register_split(1, 3)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{consumer}", ptx)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{producer}", ptx)


@pytest.mark.parametrize("mode", ["global", "grid_constant"])
def test_tensor_maps_as_grid_constant_parameters(mode):
    """LowerOptions.tensormap_params="grid_constant": every tensor-map parameter of the native
    kernels is a 128-byte, 64-byte-aligned by-value parameter (.param .b8 [128], kind "tmap" in
    the manifest, which the launcher fills with the map's bytes) that the kernel addresses
    generically (cvta.param); "global" keeps the address of a device copy (kind "ptr")."""
    import re

    pytest.importorskip("kdagen._mlir")
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    comp = Compilation("kda_fwd", dict(head_k_dim=64, head_v_dim=64), "sm_90a",
                       lower=dict(DEFAULT_LOWERING, tensormap_params=mode))
    comp.run(until="cubin" if HAS_PTXAS else "ptx")
    for k in comp.kernels:
        maps = set(k.launch.get("tensor_maps") or ())
        assert maps, k.name
        kinds = {p["name"]: p["kind"] for p in k.param_dicts()}
        assert {kinds[m] for m in maps} == {"tmap" if mode == "grid_constant" else "ptr"}
        ptx = comp.ptx[k.name]
        by_value = re.findall(rf"\.param \.align 64 \.b8 {k.name}_param_(\d+)\[128\]", ptx)
        names = [p["name"] for p in k.param_dicts()]
        assert sorted(names[int(i)] for i in by_value) == (
            sorted(maps) if mode == "grid_constant" else []), k.name
        assert ("cvta.param" in ptx) == (mode == "grid_constant")
    if HAS_PTXAS:
        for name, res in comp.assembled.items():
            assert res.ok and all(r.spill_stores == 0 for r in res.resources.values()), name


def test_unknown_tensormap_params_is_an_actionable_error(kda_fwd_native):
    from kdagen.codegen.lower.kernel import LowerOptions, prepare
    from kdagen.codegen.lower.plan import LoweringError
    from kdagen.target import get_target
    program, _ = kda_fwd_native
    with pytest.raises(LoweringError, match="'grid_constant'"):
        prepare(program, get_target("sm_90a"), "t",
                LowerOptions(path="native", tensormap_params="byvalue"))
