// nccl-tests' command line for bench-collectives: -b -e -f -d -o -n -w -c, sizes written 8, 1K, 128M, 1G, and the
// names nccl-tests gives data types and reductions, mapped to what Loom's collectives take. Host only (no GPU), so
// CPU unit tests parse the same arguments the benchmark does.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/ops/collectives.hpp"
#include "loom/tensor.hpp"

namespace loom::bench {

// A byte count as nccl-tests writes it: digits with an optional K, M, G (powers of 1024; KiB, MiB, GiB and lower
// case too). Zero or anything else raises loom::Error naming `flag`.
std::size_t parse_size(const std::string& text, const std::string& flag);

// The sizes from min to max: min, min x factor, ... while <= max. factor must be >= 2 unless min == max.
std::vector<std::size_t> size_series(std::size_t min_bytes, std::size_t max_bytes, int factor);

// nccl-tests' type names (-d): float, half, bfloat16, f8e4m3, int32, int64, uint8, and Loom's (f32, f16, bf16, u8).
// nccl-tests types Loom has no collective dtype for (double, int8, uint32, uint64, f8e5m2) and unknown names raise.
DType parse_dtype(const std::string& name);
const char* nccl_type_name(DType t);  // the name nccl-tests prints: "float", "half", "bfloat16", ...
bool reducible(DType t);              // what reduce_scatter / all_reduce take: float, half, bfloat16

// nccl-tests' reduction names (-o): sum and max; prod, min, avg (and unknown names) raise.
ReduceOp parse_redop(const std::string& name);
const char* nccl_op_name(ReduceOp op);  // "sum", "max"

// A collective by Loom's name (all_reduce) or nccl-tests' (allreduce, all_reduce_perf); all_to_all_v raises.
CollKind parse_coll(const std::string& name);
bool is_reduction(CollKind k);  // reduce_scatter, all_reduce

// nccl-tests' bus-bandwidth factor: busbw = algbw x factor. all_reduce 2(n-1)/n; all_gather, reduce_scatter and
// all_to_all (n-1)/n.
double bus_factor(CollKind k, int ranks);
// algbw in GB/s (1e9 bytes per second) of `bytes` moved in `us` microseconds.
inline double algbw_gbps(double bytes, double us) { return us > 0 ? bytes / (us * 1e3) : 0.0; }

// One measured size of collective `k` at `ranks` ranks, as nccl-tests sizes it: `bytes` of the larger buffer
// (all_gather: out, reduce_scatter: in, all_reduce / all_to_all: either) rounded down to whole elements, and for the
// chunked ops (all but all_reduce) to `ranks` equal chunks. count = bytes / element size; chunk = elements per
// rank's chunk (all_reduce: count). A size too small for one element per chunk gives count 0.
struct CollSize {
    std::size_t bytes = 0, count = 0, chunk = 0;
    std::size_t in_count = 0, out_count = 0;  // per rank
};
CollSize coll_size(CollKind k, std::size_t bytes, DType t, int ranks);

// The table mode's arguments (nccl-tests' flags).
struct NcclArgs {
    std::size_t min_bytes = 8;
    std::size_t max_bytes = std::size_t(128) << 20;
    int step_factor = 2;
    std::vector<std::string> dtypes = {"float"};  // -d, comma-separated; "all": every type the collective takes
    std::vector<std::string> redops = {"sum"};    // -o, comma-separated; "all": sum and max
    int iters = 20;                               // -n: calls back to back per timed run
    int warmup = 5;                               // -w: untimed calls before timing
    int check = 1;                                // -c: 1 = check every element of every rank's result
    int runs = 1;                                 // timed runs of -n calls per size; the median one is shown
    std::uint64_t seed = 0;                       // inputs' seed (0: from the clock)
};

// Registers nccl-tests' -b/--minbytes (also --min-bytes), -e/--maxbytes (--max-bytes), -f/--stepfactor,
// -d/--datatype, -o/--op, -n, -w/--warmup_iters, -c/--check, and --runs and --seed, on `app`, writing into `a`.
// (-n has no long name: --iters is the JSON sweep's.) A bad size is a CLI::ValidationError naming the flag.
void add_nccl_options(CLI::App& app, NcclArgs& a);

// Validated (type, reduction) pairs of `k` from a's -d and -o: "all" expanded, a type or reduction the collective
// does not take raising loom::Error that names the flag. Data movement takes every type and prints "none".
struct TypeOp {
    DType dtype;
    ReduceOp op;
    std::string op_name;  // "sum", "max", or "none" for data movement
};
std::vector<TypeOp> type_ops(CollKind k, const NcclArgs& a);

}  // namespace loom::bench
