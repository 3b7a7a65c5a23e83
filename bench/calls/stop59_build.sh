#!/usr/bin/env bash
# Build here (MLIR, no GPU) the bundles of bench/calls/stop59.sh, packed into .gpucarry/:
#   bash bench/calls/stop59_build.sh [NAME ...]
# Sets:
#   dq   bench bundles (B1_T8k_H16, valid at T32k; gdn only) for the dq kernel on register
#        tiles with the register lowering's sums in the native order:
#          ab_dq2  dq on register tiles, the reverse scan on two warpgroups (today's default)
#          ab_dq1  dq on register tiles, the reverse scan back on one warpgroup (two CTAs per
#                  head: it was faster alone, 3.04 vs 4.38 us/step, but took 16 SMs from dq)
#          ab_dkns the dk kernel on register tiles (per-term row sums: 788 B of spill)
#   c2     two chunks per CTA for the register-tile kernels (register_tile_chunks_per_cta=2:
#          the second chunk's copies land while the first computes): ab_c2 (both GDN
#          prologues), ab_c2o (and the forward's output kernel, then at one CTA per SM),
#          check_c2 (the GPU check's gdn_* set with all three)
#   v2     after the token-tile masks were dropped (register tiles read rows past the sequence
#          end as the zeros they were set to): bench_nm (gdn, the new default), ab_dq1, ab_dq2,
#          ab_c2 again, check_nm (gdn_*, the new default), check_dq1ns, check_c2 again
#   knobs  native-path options never measured on these kernels: ab_gk4lb2 (gdn_bwd's dk kernel
#          at load_batch=2, which won 9% on kda_bwd's), ab_kk4sor (kda_bwd's dk kernel with
#          scan_operand_reads=2: its column cumsum reads one materialised buffer; the cost
#          report counts 6088 instead of 6312 instructions per thread)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
K4=gdn_bwd.k4_scan4:register_tiles=true+register_tile_warpgroups=2
DQ1=gdn_bwd.k2_scan2:register_tiles=true+register_tile_warpgroups=2+register_tile_ctas_per_sm=1
WG1=gdn_bwd.k3_scan3:scan_warpgroups=1
NS=register_tile_sums=native
mkdir -p .bundles .gpucarry
source bench/calls/build_common.sh
built=()
for set in "${@:-dq}"; do
    case "$set" in
    dq)
        bench ab_dq2 --ops gdn --set tune=$DQ1 --set $NS
        bench ab_dq1 --ops gdn --set tune=$DQ1,$WG1 --set $NS
        bench ab_dkns --ops gdn --set tune=$K4 --set $NS
        built+=(ab_dq2 ab_dq1 ab_dkns) ;;
    c2)
        C2=gdn_fwd.k0_scan0:register_tile_chunks_per_cta=2,gdn_bwd.k0_scan0:register_tile_chunks_per_cta=2
        C2O=$C2,gdn_fwd.k2_scan2:register_tile_chunks_per_cta=2
        bench ab_c2 --ops gdn --set tune=$C2
        bench ab_c2o --ops gdn --set tune=$C2O
        check check_c2 gdn_ --lower tune=$C2O
        built+=(ab_c2 ab_c2o check_c2) ;;
    v2)
        C2=gdn_fwd.k0_scan0:register_tile_chunks_per_cta=2,gdn_bwd.k0_scan0:register_tile_chunks_per_cta=2
        bench bench_nm --ops gdn
        bench ab_dq2 --ops gdn --set tune=$DQ1 --set $NS
        bench ab_dq1 --ops gdn --set tune=$DQ1,$WG1 --set $NS
        bench ab_c2 --ops gdn --set tune=$C2
        check check_nm gdn_
        check check_dq1ns gdn_ --lower tune=$DQ1 --lower $NS
        check check_c2 gdn_ --lower tune=$C2
        built+=(bench_nm ab_dq2 ab_dq1 ab_c2 check_nm check_dq1ns check_c2) ;;
    knobs)
        bench ab_gk4lb2 --ops gdn --set tune=gdn_bwd.k4_scan4:load_batch=2
        bench ab_kk4sor --ops kda --set tune=kda_bwd.k4_scan4:scan_operand_reads=2
        built+=(ab_gk4lb2 ab_kk4sor) ;;
    *) echo "unknown set $set" >&2; exit 2 ;;
    esac
done
pack "${built[@]}"
