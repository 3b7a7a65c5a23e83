"""The SASS instruction mix (kdagen.codegen.sass): parsing nvdisasm's and cuobjdump's listings, the opcode
classes, and the cubin stage's report (with ptxas and nvdisasm; the compiler extra installs
nvdisasm)."""
from __future__ import annotations

import shutil

import pytest

from kdagen.codegen import sass

LISTING = """
	code for sm_90a
		Function : kernel_a
	.headerflags	@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                   /* 0x00000a00ff017b82 */
        /*0010*/                   LOP3.LUT R3, R2, 0xffff0000, RZ, 0xc0, !PT ;
        /*0020*/              @!P0 FADD R4, R3, -R5 ;
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0040*/                   LDS R6, [R110+0x19ab0] ;
        /*0050*/                   EXIT ;
		..........
		Function : kernel_b
        /*0000*/                   UMOV UR4, 0x400 ;
        /*0010*/                   MUFU.EX2 R2, R2 ;
        /*10000*/                  BAR.SYNC.DEFER_BLOCKING 0x0 ;
"""


NVDISASM = """
	.section	.nv.info.kernel_a,"",@"SHT_CUDA_INFO"
        /*0000*/ 	.byte	0x04, 0x1c, 0x04, 0x00
	.section	.text.kernel_a,"ax",@progbits
.text.kernel_a:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA `(.L_x_1) ;
.L_x_1:
        /*0020*/                   EXIT ;
	.section	.nv.shared.kernel_a,"aw",@nobits
        /*0000*/ 	.zero	1024
"""


def test_nvdisasm_listing_counts_each_kernels_text_section_only():
    assert sass.parse_sass(NVDISASM) == {"kernel_a": {"LDC": 1, "BRA": 1, "EXIT": 1}}


def test_listing_is_parsed_per_kernel_with_predicates_dropped():
    got = sass.parse_sass(LISTING)
    assert set(got) == {"kernel_a", "kernel_b"}
    assert got["kernel_a"] == {"LDC": 1, "LOP3.LUT": 1, "FADD": 1,
                               "HGMMA.64x64x16.F32.BF16": 1, "LDS": 1, "EXIT": 1}
    # five-digit addresses (kernels past 64 KB of code) count too
    assert sum(got["kernel_b"].values()) == 3


@pytest.mark.parametrize("opcode,cls", [("LOP3.LUT", "integer"), ("IMAD.U32", "integer"),
                                        ("FADD", "fp32"), ("HGMMA.64x64x16.F32.BF16", "tensor"),
                                        ("LDS.128", "shared"), ("UTMALDG.3D", "global"),
                                        ("MUFU.EX2", "sfu"), ("F2FP.BF16.F32.PACK_AB", "convert"),
                                        ("UMOV", "uniform"), ("R2UR", "uniform"),
                                        ("BAR.SYNC.DEFER_BLOCKING", "sync"), ("BRA", "control")])
def test_opcodes_fall_in_their_classes(opcode, cls):
    assert sass.classify(opcode) == cls


@pytest.mark.skipif(shutil.which("ptxas") is None or sass.find_nvdisasm() is None,
                    reason="ptxas or nvdisasm not installed")
def test_cubin_stage_reports_the_sass_mix_and_prices_register_tile_kernels():
    """Every assembled kernel gets its SASS count; the register-tile kernels (GDN's prologue
    and output kernel) a SASS estimate per CTA. Their SASS count exceeds the lowering's static
    count (address arithmetic, bf16 packing, predicates: what ptxas adds)."""
    import re

    from kdagen import driver
    from kdagen.codegen.lower.cost_model import SASS_NS_PER_INSTRUCTION
    comp = driver.Compilation("gdn_fwd", {}, chip="sm_90a",
                              lower=dict(driver.DEFAULT_LOWERING)).run("cubin")
    text = comp.output("cubin")
    kernels = re.split(r"^// ----- kernel (\S+) -----$", text, flags=re.M)[1:]
    per = dict(zip(kernels[::2], kernels[1::2]))
    assert len(per) == len(comp.kernels) == 3
    for k in comp.kernels:
        m = re.search(r"// SASS \(nvdisasm\): (\d+) instructions", per[k.name])
        assert m, per[k.name]
        n = int(m.group(1))
        est = re.search(r"SASS ESTIMATE .*: ([\d.]+) us per CTA", per[k.name])
        if k.path == "sm90-register-tile":
            assert est and float(est.group(1)) == pytest.approx(n * SASS_NS_PER_INSTRUCTION
                                                                / 1000, abs=0.01)
            static = sum(v for key, v in k.cost["counts"].items()
                         if isinstance(v, int) and key not in ("bytes.global", "loop_iters",
                                                               "global_rounds",
                                                               "shared_rounds"))
            assert n > static
        else:
            assert est is None
