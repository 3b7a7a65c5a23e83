"""The per-kernel table of ``kdagen bench --kernels``, on the CPU: occupancy arithmetic, the
row builder on a hand-written manifest entry with made-up times, µs per chunk step, the
bandwidth floor, grouping launches across calls, the printed table, the parser, and the IR's
byte count reaching the manifest. No GPU, no wall-clock times."""
import pytest

from kdagen import benchmark
from kdagen.kernel_table import (SmLimits, bandwidth_floor_us, bytes_moved, ctas_per_sm,
                                 format_kernel_table, group_launches, is_serial, kernel_row,
                                 pct_of_floor, sm_limits, us_per_chunk_step)

KB = 1024


def test_hopper_limits():
    lim = sm_limits("sm_90a")
    assert (lim.regs_per_sm, lim.threads_per_sm, lim.ctas_per_sm) == (65536, 2048, 32)
    assert (lim.smem_per_sm, lim.smem_per_block, lim.smem_reserved_per_cta) == (228 * KB, 227 * KB,
                                                                                 KB)
    # the per-CTA maximum is the chip table's (kdagen/target.py)
    assert sm_limits("sm_120a").smem_per_block == 99 * KB


@pytest.mark.parametrize("threads,registers,smem,expected", [
    # 8 warps x 232 x 32 = 7424 registers each: 2 warps per 16384-register partition, 8 per SM
    (256, 232, 0, 1),
    (256, 232, 207888, 1),          # the sm_90a kda_fwd kernels: 203 KB of shared memory
    (384, 168, 0, 1),               # 5376 per warp: 3 per partition, 12 warps = one CTA
    (128, 64, 0, 8),                # 2048 per warp: 8 per partition, 32 warps / 4
    (128, 32, 0, 16),               # registers and threads (2048 / 128) both allow 16
    (32, 16, 0, 32),                # threads would allow 64: capped at 32 CTAs per SM
    (64, 200, 0, 4),                # 6400 per warp: 2 per partition -> 8 warps, not 65536/6400=10
    (128, 170, 0, 2),               # 170 x 32 = 5440 rounds up to 5632: 2 per partition, not 3
    (1024, 64, 0, 1),               # 32 warps x 2048 = the whole register file
    (1024, 128, 0, 0),              # 32 warps x 4096 = twice the register file: no launch
    (128, 256, 0, 0),               # over 255 registers per thread
    (32, 16, 8 * KB, 25),           # 8 KB + 1 KB reserved: 228 / 9 = 25
    (128, 32, 100 * KB, 2),         # 101 KB per CTA: 2 in 228 KB
    (128, 32, 113 * KB, 2),         # 114 KB per CTA: exactly 2
    (128, 32, 113 * KB + 1, 1),     # rounded up to 128 bytes: 2 no longer fit
    (128, 32, 227 * KB, 1),         # the per-CTA maximum
    (128, 32, 227 * KB + 1, 0),     # over it
])
def test_ctas_per_sm(threads, registers, smem, expected):
    assert ctas_per_sm(threads, registers, smem) == expected


def test_ctas_per_sm_takes_other_limits():
    small = SmLimits(regs_per_sm=65536, reg_partitions=4, reg_unit_per_warp=256,
                     max_regs_per_thread=255, smem_per_sm=100 * KB, smem_per_block=99 * KB,
                     smem_reserved_per_cta=KB, smem_unit=128, threads_per_sm=1536,
                     ctas_per_sm=32)
    assert ctas_per_sm(128, 32, 0, small) == 12               # 1536 / 128
    assert ctas_per_sm(128, 32, 48 * KB, small) == 2          # 100 / 49


def test_serial_kernels_are_state_scans():
    assert is_serial({"kind": "tile", "grid": ["HV", "N", "1"], "parallel_chunks": False})
    assert not is_serial({"kind": "tile", "grid": ["HV", "N", "max_chunks"],
                          "parallel_chunks": True})
    # a global reduction has grid z = 1 but no chunk loop
    assert not is_serial({"kind": "global", "grid": ["ceil_div(HV * 128, 256)", 1, 1]})
    # manifests without parallel_chunks: the grid z rule decides
    assert is_serial({"grid": ["HV", "N", 1]})
    assert not is_serial({"grid": ["HV", "N", "max_chunks"]})


def test_us_per_chunk_step():
    assert us_per_chunk_step(11032.0, 8192, 64) == 86.1875             # 128 chunks
    assert us_per_chunk_step(500.0, 16000, 64) == 2.0                  # varlen: longest 250 chunks
    assert us_per_chunk_step(129.0, 8193, 64) == 1.0                   # a partial chunk counts


def test_bytes_and_bandwidth_floor():
    nbytes = bytes_moved(3330.0, 8192, 16)
    assert nbytes == 436_469_760
    assert bandwidth_floor_us(nbytes) == pytest.approx(90.9312)       # at 4.8e12 B/s
    assert bandwidth_floor_us(4.8e12) == pytest.approx(1e6)
    assert pct_of_floor(90.9312, 181.8624) == pytest.approx(50.0)


def _state_entry(**resources):
    return {"name": "kda_fwd_K128V128C64_x__k1_scan1", "chip": "sm_90a",
            "launch": {"grid": ["HV", "N", "1"], "block": [256, 1, 1], "kind": "tile",
                       "parallel_chunks": False, "dynamic_shared_memory": 206864,
                       "hbm_bytes_per_token": 3072.0},
            "resources": resources or None}


def test_kernel_row_of_a_state_scan():
    entry = _state_entry(registers=232, shared_bytes=1024)
    row = kernel_row(entry, (16, 1, 1), [100.0, 300.0, 200.0], tokens=8192, value_heads=16,
                     longest_tokens=8192)
    assert row["kernel"] == entry["name"] and row["grid"] == [16, 1, 1]
    assert (row["threads"], row["registers"], row["smem_bytes"]) == (256, 232, 207888)
    assert row["ctas_per_sm"] == 1
    assert row["us"] == 200.0 and row["reps"] == 3                    # the median
    assert row["us_per_step"] == 1.5625                               # 200 / 128 chunks
    assert row["bytes"] == 402_653_184                                # 3072 x 8192 x 16
    assert row["floor_us"] == pytest.approx(83.88608)
    assert row["pct_floor"] == pytest.approx(41.94304)


def test_kernel_row_of_a_scan_run_as_segments():
    """A call run as segments (kdagen.runtime.segments) launches its scans over B·P
    sequences: each walks T / P tokens, and its µs per step counts those."""
    entry = _state_entry(registers=232, shared_bytes=1024)
    row = kernel_row(entry, (16, 8, 1), [200.0], tokens=8192, value_heads=16,
                     longest_tokens=8192, sequences=1)
    assert row["us_per_step"] == 12.5                                 # 200 / (128 / 8) chunks
    whole = kernel_row(entry, (16, 2, 1), [200.0], tokens=16384, value_heads=16,
                       longest_tokens=8192, sequences=2)
    assert whole["us_per_step"] == 1.5625                             # B = 2, not segments


def test_kernel_row_without_ptxas_or_byte_count():
    entry = _state_entry()
    entry["launch"] = {**entry["launch"], "parallel_chunks": True,
                       "grid": ["HV", "N", "max_chunks"]}
    del entry["launch"]["hbm_bytes_per_token"]
    row = kernel_row(entry, (16, 1, 128), [50.0], tokens=8192, value_heads=16,
                     longest_tokens=8192)
    assert row["registers"] is None and row["ctas_per_sm"] is None
    assert row["smem_bytes"] == 206864
    assert row["us_per_step"] is None                                 # chunk-parallel
    assert row["bytes"] is None and row["pct_floor"] is None


def test_group_launches_matches_repeats_and_keeps_launch_order():
    a, b = {"name": "a"}, {"name": "b"}
    calls = [[("a", (1, 1, 2), a, 1.0), ("b", (1, 1, 1), b, 5.0), ("a", (1, 1, 2), a, 3.0)],
             [("a", (1, 1, 2), a, 2.0), ("b", (1, 1, 1), b, 6.0), ("a", (1, 1, 2), a, 4.0)]]
    grouped = group_launches(calls)
    assert [(name, times) for name, _, _, times in grouped] == [
        ("a", [1.0, 2.0]), ("b", [5.0, 6.0]), ("a", [3.0, 4.0])]


def test_table_is_aligned_and_marks_missing_values():
    rows = [{"impl": "kdagen", "op": "kda", "config": "B1_T8k_H16", "mode": "fwd",
             **kernel_row(_state_entry(registers=232, shared_bytes=0), (16, 1, 1), [11032.0],
                          tokens=8192, value_heads=16, longest_tokens=8192)},
            {"impl": "kdagen", "op": "kda", "config": "B1_T8k_H16", "mode": "fwd",
             "kernel": "p__k2_sum", "grid": [1, 1, 1], "threads": 256, "registers": None,
             "ctas_per_sm": None, "smem_bytes": 0, "us": 3.25, "us_per_step": None,
             "bytes": None, "pct_floor": None}]
    lines = format_kernel_table(rows).splitlines()
    assert lines[0].split() == ["impl", "op", "config", "mode", "kernel", "grid", "threads",
                                "CTA/SM", "regs", "smem", "B", "us", "us/step", "MB", "%",
                                "floor", "L2", "MB", "SASS", "ns/SASS"]
    assert lines[1].split()[4:] == ["k1_scan1", "16,1,1", "256", "1", "232", "206864", "11032.0",
                                    "86.19", "402.7", "0.8", "-", "-", "-"]
    assert lines[2].split()[4:] == ["k2_sum", "1,1,1", "256", "-", "-", "0", "3.2", "-", "-",
                                    "-", "-", "-", "-"]
    # right-aligned numbers: every row's "us" column ends where the header's does
    end = lines[0].index("us/step") - 2
    assert all(line[end - 1] != " " and line[end] == " " for line in lines)


def test_parser_accepts_kernels():
    args = benchmark.build_parser().parse_args(["--kernels", "--kernel-reps", "5"])
    assert args.kernels is True and args.kernel_reps == 5
    default = benchmark.build_parser().parse_args([])
    assert default.kernels is False and default.kernel_reps == 20


def test_kernel_rows_put_the_context_in_front(monkeypatch):
    entry = _state_entry(registers=232, shared_bytes=0)
    calls = [[(entry["name"], (16, 1, 1), entry, us)] for us in (90.0, 100.0, 110.0)]
    monkeypatch.setattr(benchmark, "time_kernel_launches", lambda run, reps: calls[:reps])
    context = {"impl": "kdagen", "op": "kda", "config": "B1_T8k_H16", "mode": "fwd"}
    rows = benchmark.kernel_rows(None, 3, context, tokens=8192, value_heads=16,
                                 longest_tokens=8192)
    assert len(rows) == 1 and list(rows[0])[:4] == list(context)
    assert rows[0]["us"] == 100.0 and rows[0]["us_per_step"] == 100.0 / 128


def test_manifest_launch_carries_the_ir_byte_count():
    """kda-partition's kda.hbm_bytes_per_token of each scan reaches the kernel's launch dict
    (what the bundle writer puts in manifest.json); unpartitioned kernels have none."""
    from kdagen.codegen.lower.kernel import LowerOptions, prepare
    from kdagen.codegen.lower.program import read_program
    from kdagen.driver import build_module
    from kdagen.passes.partition import kernel_report
    from kdagen.target import get_target

    module = build_module("kda_fwd", {}, pipeline="chip", chip="sm_90a")
    counts = [hbm for _, _, hbm in kernel_report(module)]
    kernels = prepare(read_program(module), get_target("sm_90a"), "t", LowerOptions())
    assert [k.launch["hbm_bytes_per_token"] for k in kernels] == counts
    assert counts and all(c > 0 for c in counts)
    stable = build_module("kda_fwd", {}, pipeline="stable", chip="sm_90a")
    assert all("hbm_bytes_per_token" not in k.launch
               for k in prepare(read_program(stable), get_target("sm_90a"), "t", LowerOptions()))


def test_launch_recorders_nest_and_leave():
    """Recorders are active only inside their block; leaving an inner one keeps the outer."""
    from kdagen.runtime import launch
    with launch.LaunchRecorder() as outer:
        with launch.LaunchRecorder() as inner:
            assert launch._RECORDERS == [outer, inner]
        assert launch._RECORDERS == [outer]
    assert launch._RECORDERS == []


def test_static_l2_bytes_scale_the_cost_reports_count_to_the_grid():
    """l2_bytes: the manifest's per-CTA LDG/STG bytes (cost report) x the CTAs launched; none
    without a cost report."""
    entry = _state_entry(registers=96, shared_bytes=0)
    assert kernel_row(entry, (16, 1, 128), [10.0], tokens=8192, value_heads=16,
                      longest_tokens=8192)["l2_bytes"] is None
    entry["cost"] = {"global_bytes_per_cta": 1_624_064}
    row = kernel_row(entry, (16, 1, 128), [10.0], tokens=8192, value_heads=16,
                     longest_tokens=8192)
    assert row["l2_bytes"] == 1_624_064 * 16 * 128
    assert format_kernel_table([{"impl": "k", "op": "kda", "config": "c", "mode": "fwdbwd",
                                 **row}]).splitlines()[1].split()[-3] == "3326.1"


def test_chunk_kernel_row_prices_its_sass_per_wave():
    """A register-tile kernel whose manifest carries its SASS count gets ns per SASS
    instruction: µs over its waves of CTAs (CTAs / (SMs x CTAs per SM)), per instruction;
    kernels with loops (a native chunk kernel, a serial scan: their listing is not what they
    execute) get none."""
    entry = _state_entry(registers=118, shared_bytes=0)
    entry["path"] = "sm90-register-tile"
    entry["launch"] = {**entry["launch"], "parallel_chunks": True,
                       "grid": ["HV", "N", "max_chunks"], "block": [256, 1, 1],
                       "dynamic_shared_memory": 116736}
    entry["resources"]["sass_instructions"] = 3600
    row = kernel_row(entry, (16, 1, 512), [900.0], tokens=32768, value_heads=16,
                     longest_tokens=32768, sms=132)
    assert row["ctas_per_sm"] == 1 and row["sass"] == 3600
    waves = -(-16 * 512 // 132)
    assert row["ns_per_sass"] == pytest.approx(1000 * 900.0 / waves / 3600)
    assert "ns/SASS" in format_kernel_table([row]) and "3600" in format_kernel_table([row])
    entry["path"] = "sm90-native"
    assert kernel_row(entry, (16, 1, 512), [900.0], tokens=32768, value_heads=16,
                      longest_tokens=32768, sms=132)["ns_per_sass"] is None
    serial = _state_entry(registers=232, shared_bytes=0)
    serial["resources"]["sass_instructions"] = 900
    row = kernel_row(serial, (16, 1, 1), [1000.0], tokens=8192, value_heads=16,
                     longest_tokens=8192, sms=132)
    assert row["sass"] == 900 and row["ns_per_sass"] is None


def test_register_tile_path_name_matches_the_lowering():
    """kernel_table (runtime side, no MLIR) names the register-tile path as the lowering does."""
    from kdagen.codegen.lower.register_tiles import PATH_NAME
    from kdagen.kernel_table import REGISTER_TILE_PATH
    assert REGISTER_TILE_PATH == PATH_NAME
