#!/usr/bin/env bash
# usage: scripts/gpu_session.sh <build dir> <out dir> [steps...]
# GPU tests and benchmarks in one call, each step time-boxed. Every log goes into OUT/session.log; only the
# benchmark JSON files sit beside it.
#   steps: gpu_tests dist2 dist4 dist8 demo bench_lang bench_runtime bench_gemm bench_jit diag (default: these)
#          bench_gemm_c1 (bench-gemm with 1-CTA clusters forced, into gemm_cluster1.json)
#          dist_small_scratch (Collectives.* at 8 ranks, --coll-scratch=1M)
#          overlap (test_overlap at 2/4/8 ranks + examples 05/06), bench_overlap, bench_overlap_quick (not default)
#          bench_coll (not default; 4 files: run it in a call of its own, or with steps that write few files)
#          bench_coll2 (bench_coll at 2 ranks only: on a two-GPU machine, one rank per GPU with NCCL beside)
#          topo (GPUs, links, PyTorch's view), torch_tp (bench/torch_async_tp.py on every GPU: torch_tp.json, which
#          bench_overlap then folds in as the PyTorch baselines)
#          bench_lang_shared (bench_lang with both ranks on GPU 0, into OUT/shared: the shared-GPU figures on a
#          machine with several GPUs)
#          save_cache (LOOM_CACHE_DIR as OUT/jit-cache.tgz)
#   diag runs the diagnostic-mailbox tests, then the stalled-pipeline probe.
# Variables:
#   LOOM_DIST_FILTER     GoogleTest filter of the multi-rank steps (default: every test)
#   LOOM_DIST2_SECONDS   time limit of the dist2 step (default 150)
#   LOOM_OVERLAP_RANKS   ranks of bench_overlap* (default: one per GPU, or 8 sharing a single GPU)
#   LOOM_BENCH_ARGS      extra arguments of bench_overlap (e.g. "--quick --iters 5 --rs-comm-sms 8,24")
#   LOOM_TORCH_ARGS      extra arguments of torch_tp (e.g. "--quick --iters 5")
#   LOOM_COLL_MAX        largest size of bench_coll2 (default 1G)
#   LOOM_CACHE_DIR       JIT cache (default /tmp/loom-cache); LOOM_WAIT_TIMEOUT_MS device wait bound (default 20000)
#   LOOM_TEST_SEED       seed of the tests' random inputs (default: a fresh one, written first to session.log)
#   LOOM_GIT_COMMIT      commit recorded in the benchmark JSON (default: git rev-parse --short HEAD)
# The script exports LOOM_SOURCE_DIR (the repository, for tests and benchmarks), NCCL_NVLS_ENABLE=0,
# NVSHMEM_DISABLE_NVLS=1 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLink multicast stays off).
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; fi
set -u
b=${1:?build dir}
out=${2:?out dir}
shift 2
steps=${*:-gpu_tests dist2 dist4 dist8 demo bench_lang bench_runtime bench_gemm bench_jit diag}
mkdir -p "$out"
export LOOM_CACHE_DIR=${LOOM_CACHE_DIR:-/tmp/loom-cache} LOOM_WAIT_TIMEOUT_MS=${LOOM_WAIT_TIMEOUT_MS:-20000}
export LOOM_TEST_SEED=${LOOM_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}  # the tests' inputs (printed)
export LOOM_SOURCE_DIR=$PWD NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# The benchmarks link the toolkit's libnccl.so.2; where the image has none there, PyTorch's wheel has one.
if ldd "$b/bench/bench-collectives" 2>/dev/null | grep -q 'libnccl.*not found'; then
    nccl_dir=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)/lib
    export LD_LIBRARY_PATH=$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export LOOM_GIT_COMMIT=${LOOM_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
filter=--gtest_filter=${LOOM_DIST_FILTER:-*}
# One rank per GPU when there are several (8 ranks over 2 GPUs is a mixed layout no test covers), else 8 sharing it.
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
overlap_ranks=${LOOM_OVERLAP_RANKS:-$([ "${gpus:-0}" -gt 1 ] && echo "$gpus" || echo 8)}
log=$out/session.log
echo "LOOM_TEST_SEED=$LOOM_TEST_SEED" >>"$log"
run() {  # run <seconds> <name> <command...>
    local t=$1 name=$2
    shift 2
    local s=$SECONDS
    echo "===== $name: $*" >>"$log"
    timeout -k 5 "$t" "$@" >>"$log" 2>&1
    local rc=$?
    printf '%-14s rc=%-3s %4ss\n' "$name" "$rc" $((SECONDS - s)) | tee -a "$log"
}
for s in $steps; do
    case $s in
        gpu_tests) run 80 gpu_tests "$b/tests/loom_gpu_tests" ;;
        dist2) run "${LOOM_DIST2_SECONDS:-150}" dist2 "$b/bin/loomrun" -n 2 "$b/tests/loom_dist_tests" "$filter" ;;
        dist4) run 180 dist4 "$b/bin/loomrun" -n 4 "$b/tests/loom_dist_tests" "$filter" ;;
        dist8) run 180 dist8 "$b/bin/loomrun" -n 8 "$b/tests/loom_dist_tests" "$filter" ;;
        dist_small_scratch)  # 1 MiB collective scratch: every round loop runs many rounds, at 8 ranks
            run 90 dist_small_scratch "$b/bin/loomrun" -n 8 "$b/tests/loom_dist_tests" \
                --gtest_filter='Collectives.*' --coll-scratch=1M
            ;;
        demo) run 30 demo "$b/bin/loomrun" -n 2 "$b/examples/00_hello_symmetric" ;;
        bench_lang) run 150 bench_lang "$b/bin/loomrun" -n 2 "$b/bench/bench-lang" --out "$out" ;;
        bench_lang_shared)  # on a machine with several GPUs: both ranks on GPU 0 (MPS), into OUT/shared
            mkdir -p "$out/shared"
            CUDA_VISIBLE_DEVICES=0 run 150 bench_lang_shared "$b/bin/loomrun" -n 2 "$b/bench/bench-lang" --out "$out/shared"
            ;;
        bench_runtime)
            for n in 2 4 8; do
                run 30 bench_runtime$n "$b/bin/loomrun" -n $n "$b/bench/bench-runtime" --out "$out/runtime.json" --append
            done
            ;;
        bench_gemm) run 80 bench_gemm "$b/bench/bench-gemm" --out "$out/gemm.json" ;;
        bench_gemm_c1) run 80 bench_gemm_c1 "$b/bench/bench-gemm" --heuristic-cluster 1 --out "$out/gemm_cluster1.json" ;;
        diag)  # the mailbox: no-printf missing notify (~5 s), then a stalled tile pipeline (probe, ~17 s)
            run 90 diag "$b/bin/loomrun" -n 2 "$b/tests/loom_dist_tests" \
                --gtest_filter='DiagMailboxGpu.*:LangSignal.MissingNotifyEndsInTimeoutDiagnostic'
            run 60 diag_stall "$b/bench/probe-pipeline-stall"
            ;;
        bench_jit) run 20 bench_jit "$b/bench/bench-jit" --reps 2 --out "$out/jit.json" ;;
        bench_coll)  # 4 files (all_gather/reduce_scatter/all_reduce/all_to_all.json), rows of both rank counts
            run 240 bench_coll2 "$b/bin/loomrun" -n 2 "$b/bench/bench-collectives" --out "$out" --append --max-bytes 256M --explain
            run 120 bench_coll8 "$b/bin/loomrun" -n 8 "$b/bench/bench-collectives" --out "$out" --append --max-bytes 16M
            ;;
        bench_coll2)
            run 400 bench_coll2 "$b/bin/loomrun" -n 2 "$b/bench/bench-collectives" --out "$out" --append \
                --max-bytes "${LOOM_COLL_MAX:-1G}" --explain
            ;;
        overlap)
            for n in 2 4 8; do
                run 120 overlap$n "$b/bin/loomrun" -n $n "$b/tests/loom_dist_tests" --gtest_filter='Overlap.*'
            done
            run 60 example05 "$b/bin/loomrun" -n 4 "$b/examples/05_overlapping_allgather_gemm"
            run 60 example05sm "$b/bin/loomrun" -n 4 "$b/examples/05_overlapping_allgather_gemm" 1000 1024 2048 sm
            run 60 example06 "$b/bin/loomrun" -n 4 "$b/examples/06_overlapping_gemm_reduce_scatter"
            ;;
        topo)
            run 30 topo bash -c 'nvidia-smi -L; nvidia-smi topo -m; python3 -c "import torch; print(torch.__version__, torch.cuda.device_count())"; ldd '"$b"'/bench/bench-collectives | grep -i nccl'
            ;;
        torch_tp)
            # shellcheck disable=SC2086
            run 300 torch_tp torchrun --nproc-per-node "$(nvidia-smi -L | wc -l)" bench/torch_async_tp.py --out "$out" \
                ${LOOM_TORCH_ARGS:-}
            ;;
        bench_overlap)
            torch_arg=()
            [ -f "$out/torch_tp.json" ] && torch_arg=(--torch "$out/torch_tp.json")
            # shellcheck disable=SC2086
            run 420 bench_overlap "$b/bin/loomrun" -n "$overlap_ranks" "$b/bench/bench-overlap" --out "$out" \
                "${torch_arg[@]}" ${LOOM_BENCH_ARGS:-}
            ;;
        bench_overlap_quick)
            run 120 bench_overlap_quick "$b/bin/loomrun" -n "$overlap_ranks" "$b/bench/bench-overlap" --quick --iters 10 --out "$out"
            ;;
        save_cache)  # the JIT cache, back to the caller (unpack into build/jit-cache to carry it next time)
            run 60 save_cache tar czf "$out/jit-cache.tgz" -C "$(dirname "$LOOM_CACHE_DIR")" "$(basename "$LOOM_CACHE_DIR")"
            ;;
        *) echo "unknown step $s" | tee -a "$log" ;;
    esac
done
