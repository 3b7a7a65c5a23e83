#!/usr/bin/env bash
# Build here (MLIR, no GPU) the bundles of bench/calls/stop58.sh, packed into .gpucarry/:
#   bash bench/calls/stop58_build.sh [NAME ...]      # default: the next-session set (ns)
# Sets:
#   ab      bench_def, ab_dk, ab_sw (kdagen bench bundles at B1_T8k_H16, valid at T32k) and the
#           checks check_def, check_dk, check_sw (stop 58's calls check, dkab, gdnab, kdaab,
#           swab; bench_base came from stop 57's commit f7baa44 in a git worktree)
#   ns      the register lowering's sums in the native kernels' order (register_tile_sums=native,
#           the candidate fix of the register-tile kernels' steep-gate dA_log): check_dkns
#           (gdn_* with the dk kernel on register tiles), check_dq1ns (gdn_bwd's dq kernel on
#           two warpgroups at one CTA per SM), check_defns (the default kernels) and ab_ns (a
#           bench bundle of the default with it) for stop58.sh's mode ns
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
K4=gdn_bwd.k4_scan4:register_tiles=true+register_tile_warpgroups=2
DQ1=gdn_bwd.k2_scan2:register_tiles=true+register_tile_warpgroups=2+register_tile_ctas_per_sm=1
SW=gdn_bwd.k3_scan3:scan_warpgroups=2,kda_bwd.k3_scan3:scan_warpgroups=2
mkdir -p .bundles .gpucarry
source bench/calls/build_common.sh
built=()
for set in "${@:-ns}"; do
    case "$set" in
    ab)
        bench bench_def; bench ab_dk --ops gdn --set tune=$K4; bench ab_sw --set tune=$SW
        check check_def gdn_; check check_dk gdn_ --lower tune=$K4
        check check_sw _bwd --lower tune=$SW
        built+=(bench_def ab_dk ab_sw check_def check_dk check_sw) ;;
    ns)
        check check_dkns gdn_ --lower tune=$K4 --lower register_tile_sums=native
        check check_dq1ns gdn_ --lower tune=$DQ1 --lower register_tile_sums=native
        check check_defns gdn_ --lower register_tile_sums=native
        bench ab_ns --ops gdn --set register_tile_sums=native
        built+=(check_dkns check_dq1ns check_defns ab_ns) ;;
    *) echo "unknown set $set" >&2; exit 2 ;;
    esac
done
pack "${built[@]}"
