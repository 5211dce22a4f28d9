#!/usr/bin/env bash
# usage: scripts/bench_ab.sh OUT RANKS ROUNDS NAME=BUILD[,VAR=VALUE...] NAME=BUILD[,VAR=VALUE...]
# Runs bench-gemm --quick, bench-collectives --max-bytes 16M and bench-overlap --quick of two variants, alternated
# ROUNDS times in one process tree, so both see the same GPU state. A variant is a build directory (or one made by
# scripts/carry_build.sh) and optional environment settings, e.g. `bound=build,LOOM_WAIT_TIMEOUT_MS=300000`.
# Results: OUT/<bench>-<name>-<round>[.json]; a line per run in OUT/ab.log. scripts/perf_ab.py turns them into
# a docs/perf JSON file.
if [[ ${1:-} == -h || ${1:-} == --help || $# -lt 5 ]]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; fi
set -u
out=$1 ranks=$2 rounds=$3; shift 3
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
one() { # one NAME ROUND TIMEOUT BENCH ARGS...
    local name=$1 round=$2 t=$3 bench=$4; shift 4
    local s=$SECONDS
    timeout -k 5 "$t" "$@" >>"$out/ab.log" 2>&1
    echo "$bench-$name-$round rc=$? $((SECONDS - s))s" | tee -a "$out/ab.log"
}
for ((r = 1; r <= rounds; r++)); do
    for v in "$@"; do
        name=${v%%=*} spec=${v#*=}
        IFS=, read -r -a parts <<<"$spec"
        b=${parts[0]}
        (
            export LOOM_CACHE_DIR=${LOOM_CACHE_DIR:-/tmp/loom-cache}-$name
            for kv in "${parts[@]:1}"; do export "${kv?}"; done
            one "$name" "$r" 120 overlap "$b/bin/loomrun" -n "$ranks" "$b/bench/bench-overlap" --quick --iters 5 \
                --no-nvshmem --out "$out/overlap-$name-$r"
            one "$name" "$r" 60 gemm "$b/bench/bench-gemm" --quick --out "$out/gemm-$name-$r.json"
            one "$name" "$r" 90 coll "$b/bin/loomrun" -n "$ranks" "$b/bench/bench-collectives" --max-bytes 16M \
                --no-nvshmem --out "$out/coll-$name-$r"
        )
    done
done
