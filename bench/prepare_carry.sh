#!/usr/bin/env bash
# Build, here (MLIR, no GPU), what a GPU call carries: the fla-core wheel (.whl) and kernel
# bundles packed as .gpucarry/<name>.tar.xz (bench/gpu_run.sh unpacks them into .bundles/).
# Both folders are git-ignored, so a fresh checkout runs this before its first GPU call.
#
#   bash bench/prepare_carry.sh JOB [JOB ...]        # jobs run in order, each one bundle
#
# Jobs:
#   wheels      .whl: fla-core 0.6.0 and einops (FLA in the same process)
#   first       the first kernel (KDAGEN_FIRST_KERNEL_BUNDLE=.bundles/first)
#   api         every variant of tests/test_api_gpu.py (KDAGEN_BUNDLE=.bundles/api)
#   segments    every variant of tests/test_segments_gpu.py (KDAGEN_BUNDLE=.bundles/segments)
#   bench       kdagen bench at B1_T8k_H16 and B1_T32k_H16, K = 128, the default lowering
#   bench_k256  the same at K = V = 256 (kda)
#   bench_all   kdagen bench on every DESIGN.md §6 config, K = 128 (KDAGEN_BUNDLE=.bundles/bench_all;
#               ~2.5 CPU minutes)
#   check       the GPU check's native set (python -m tools.gpu_check .bundles/check)
#   check_k256  the GPU check's K = 256 set (python -m tools.gpu_check .bundles/check_k256)
#   fla_compat  FLA's chunked-op test matrix (KDAGEN_BUNDLE=.bundles/fla_compat; long)
#   candidates  the two accuracy fixes built at stop 46, not yet GPU-checked (docs/MATH.md §3):
#               LowerOptions.ordered_sums=true and kda-assign-precision{gate_gradient_inputs=true};
#               the GPU check's native set (python -m tools.gpu_check .bundles/check_candidates)
#               and bench bundles to compare with bench (kdagen bench --bundle base=.bundles/bench
#               --bundle cand=.bundles/ab_candidates --configs B1_T8k_H16 --kernels --no-fla)
#   dalog_fix   the simulator's fix of KDA's dA_log misses (docs/MATH.md §3) built with today's
#               lowering, for the GPU check only (slow scans): kda_bwd variants of the native set
#               with ordered sums, the serial scans on the tile path (register_scan=false: the
#               register scans are TF32 only) and bf16x3 for every product of the prologue (k0)
#               and both scans (k1, k3): python -m tools.gpu_check .bundles/dalog_fix
#   ab_k256     A/B candidates at K = 256 (bench/results/cpu_k256_chunk_options.log), against
#               bench_k256: ab_k256_lb4 (load_batch=4: the cost model predicts kda_bwd's dk
#               kernel 302 -> 242 us per CTA, with a 56-byte spill) and ab_k256_cw4
#               (chunk_warpgroups=4 load_batch=2: dk 302 -> 249, a 172-byte spill; the dq
#               kernel no longer spills there)
#   ab_stop49   stop 49's A/B candidates at K = 128, B1_T8k_H16, kda (docs: the stop note):
#               ab_vectorloopsdst, ab_scanoperandreads2, ab_eagersumstrue, ab_vectorloopsoff,
#               ab_chunkwarpgroups4 (every chunk kernel at 4 consumer warpgroups);
#               compare with kdagen bench --bundle base=.bundles/bench --bundle NAME=... --no-fla
#   ab_stop50   pipeline candidates at K = 128, B1_T8k_H16, kda: ab_hoist
#               (kda-share-chunk-values{hoist_products=true}) and ab_oc
#               (kda-partition{out_crossing=true}); bench/calls/ab_stop50.sh compares them
#   ab_banks    the shared-memory bank-conflict fixes at K = 128, B1_T8k_H16, kda: ab_sv
#               (transposed_store_order=stored_vec), ab_pad (smem_pad_all=true), ab_svpad (both),
#               and the GPU check's native set with both (check_svpad); bench/calls/ab_banks_stop50.sh
#   ab_flags    stop 51's chunk-ready flags against their ablation at K = 128, B1_T8k_H16 and
#               B1_T32k_H16: ab_flagsall (chunk_flags=all: both of the backward's pairs, what
#               stop 51 measured) and ab_noflags (chunk_flags=false: every kernel in order on
#               one stream); bench/calls/ab_flags_stop51.sh
#   ab_wait     scans that wait for their wgmma groups where ptxas would (scan_group_wait):
#               ab_waitfwd (chunk_flags=forward, stop 52's default before the A/B),
#               ab_waitall (chunk_flags=all), ab_nowait (forward, scan_group_wait=false), and the
#               GPU check with chunk_flags=all (check_waitall); bench/calls/ab_wait.sh
#   ab_slots    candidates for the scans and the dk kernel, each a bench bundle and the GPU
#               check's native set with it: slot barriers acquired at the step start
#               (ab_slots, check_slots) and by products (ab_slotsp, check_slotsp), and
#               scan_operand_reads=1 (ab_opreads, check_opreads), wgmma_fresh_acc=true
#               (ab_fresh, check_fresh); with bench,
#               bench/calls/slots_stop52.sh
#   (ab_flags2, stop 52's A/B of the two-loop producer, scan_flag_loops=2: the option is gone,
#   removed at stop 53; its results stay in bench/results/h200_stop52_ab_flags2_*)
#
# Then, for example (carry [".whl", ".gpucarry"]):
#   bash bench/gpu_run.sh 'KDAGEN_BUNDLE=.bundles/api python3 -m pytest -q tests/test_api_gpu.py'
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .bundles .gpucarry

pack() {          # pack .bundles/$1 into .gpucarry/$1.tar.xz
    tar -cJf ".gpucarry/$1.tar.xz" -C .bundles "$1"
    du -h ".gpucarry/$1.tar.xz"
}

bench_bundle() {  # bench_bundle NAME CONFIGS [--set K=V ...]: a native bench bundle, packed
    local name=$1 configs=$2
    shift 2
    "$PY" bench/emit_bench_bundle.py ".bundles/$name" --path native --configs "$configs" "$@"
    pack "$name"
}

for job in "$@"; do
    echo "== $job"
    case "$job" in
        wheels)
            mkdir -p .whl
            python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
                --implementation cp --platform manylinux_2_28_x86_64 \
                --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
                -d .whl fla-core==0.6.0 einops ;;
        first)
            "$PY" -m kdagen.cli emit --op gate-cumsum --arch sm_90a -o .bundles/first
            pack first ;;
        api)
            "$PY" tests/test_api_gpu.py .bundles/api sm_90a
            pack api ;;
        segments)
            "$PY" tests/test_segments_gpu.py .bundles/segments sm_90a
            pack segments ;;
        bench)
            "$PY" bench/emit_bench_bundle.py .bundles/bench --path native \
                --configs B1_T8k_H16,B1_T32k_H16
            pack bench ;;
        bench_k256)
            "$PY" bench/emit_bench_bundle.py .bundles/bench_k256 --path native --head-dim 256 \
                --configs B1_T8k_H16 --ops kda
            pack bench_k256 ;;
        bench_all)
            "$PY" bench/emit_bench_bundle.py .bundles/bench_all --path native \
                --configs B1_T8k_H16,B1_T32k_H16,B1_T32k_H32,B8_T4k_H32,varlen_mix_H16,gva_H4_HV16_T8k
            pack bench_all ;;
        check_k256)
            "$PY" -m tools.check_bundle .bundles/check_k256 --set k256 --chips sm_90a
            pack check_k256 ;;
        check)
            "$PY" -m tools.check_bundle .bundles/check --set native --pipeline chip \
                --chips sm_90a
            pack check ;;
        dalog_fix)
            "$PY" -m tools.check_bundle .bundles/dalog_fix --set native --pipeline chip \
                --chips sm_90a --only kda_bwd --lower ordered_sums=true \
                --lower register_scan=false --kernel-dot k0=bf16x3,k1=bf16x3,k3=bf16x3
            pack dalog_fix ;;
        candidates)
            cand="chip+kda-assign-precision{gate_gradient_inputs=true}"
            "$PY" -m tools.check_bundle .bundles/check_candidates --set native \
                --pipeline "$cand" --chips sm_90a --lower ordered_sums=true
            pack check_candidates
            "$PY" bench/emit_bench_bundle.py .bundles/ab_candidates --path native \
                --configs B1_T8k_H16 --pipeline "$cand" --set ordered_sums=true
            pack ab_candidates ;;
        fla_compat)
            "$PY" tests/test_fla_compat.py .bundles/fla_compat sm_90a
            pack fla_compat ;;
        ab_k256)
            "$PY" bench/emit_bench_bundle.py .bundles/ab_k256_lb4 --path native --head-dim 256 \
                --configs B1_T8k_H16 --ops kda --set load_batch=4
            pack ab_k256_lb4
            "$PY" bench/emit_bench_bundle.py .bundles/ab_k256_cw4 --path native --head-dim 256 \
                --configs B1_T8k_H16 --ops kda --set chunk_warpgroups=4 --set load_batch=2
            pack ab_k256_cw4 ;;
        ab_stop49)
            # stop 49's candidates, each against bench at B1_T8k_H16 (kda): vector_loops=dst,
            # scan_operand_reads=2, eager_sums=true, vector_loops=off (the ablation) and
            # chunk_warpgroups=4 (kda_fwd's shared-memory chunk kernels run 2 warps per scheduler)
            for kv in vector_loops=dst scan_operand_reads=2 eager_sums=true vector_loops=off \
                    chunk_warpgroups=4; do
                name=ab_${kv//[=_]/}
                "$PY" bench/emit_bench_bundle.py ".bundles/$name" --path native \
                    --configs B1_T8k_H16 --ops kda --set "$kv"
                pack "$name"
            done ;;
        ab_stop50)
            for spec in "hoist:kda-share-chunk-values{hoist_products=true}" \
                        "oc:kda-partition{out_crossing=true}"; do
                name=ab_${spec%%:*}
                "$PY" bench/emit_bench_bundle.py ".bundles/$name" --path native \
                    --configs B1_T8k_H16 --ops kda --pipeline "chip+${spec#*:}"
                pack "$name"
            done ;;
        ab_flags)
            bench_bundle ab_flagsall B1_T8k_H16,B1_T32k_H16 --set chunk_flags=all
            bench_bundle ab_noflags B1_T8k_H16,B1_T32k_H16 --set chunk_flags=false ;;
        ab_wait)
            configs=B1_T8k_H16,B1_T32k_H16,B8_T4k_H32
            bench_bundle ab_waitfwd $configs --set chunk_flags=forward
            bench_bundle ab_waitall $configs --set chunk_flags=all
            bench_bundle ab_nowait $configs --set chunk_flags=forward --set scan_group_wait=false
            "$PY" -m tools.check_bundle .bundles/check_waitall --set native --pipeline chip \
                --chips sm_90a --lower chunk_flags=all
            pack check_waitall ;;
        ab_slots)
            for spec in "ab_slots:scan_slot_barriers=true scan_slot_acquire=start" \
                        "ab_slotsp:scan_slot_barriers=true scan_slot_acquire=products" \
                        "ab_opreads:scan_operand_reads=1" "ab_fresh:wgmma_fresh_acc=true"; do
                name=${spec%%:*}
                sets=(); lowers=()
                for kv in ${spec#*:}; do sets+=(--set "$kv"); lowers+=(--lower "$kv"); done
                bench_bundle $name B1_T8k_H16,B1_T32k_H16 "${sets[@]}"
                "$PY" -m tools.check_bundle .bundles/check_${name#ab_} --set native \
                    --pipeline chip --chips sm_90a "${lowers[@]}"
                pack check_${name#ab_}
            done ;;
        ab_banks)
            for spec in "sv:transposed_store_order=stored_vec" "pad:smem_pad_all=true" \
                        "svpad:transposed_store_order=stored_vec smem_pad_all=true"; do
                name=ab_${spec%%:*}
                sets=()
                for kv in ${spec#*:}; do sets+=(--set "$kv"); done
                "$PY" bench/emit_bench_bundle.py ".bundles/$name" --path native \
                    --configs B1_T8k_H16 --ops kda "${sets[@]}"
                pack "$name"
            done
            "$PY" -m tools.check_bundle .bundles/check_svpad --set native --pipeline chip \
                --chips sm_90a --lower transposed_store_order=stored_vec --lower smem_pad_all=true
            pack check_svpad ;;
        *)
            echo "unknown job: $job (see the header of $0)" >&2
            exit 2 ;;
    esac
done
du -sh .gpucarry
