// The one benchmark harness: warm-up, L2 flush, cross-rank barrier, CUDA events, median of many runs, and the
// JSON report committed under docs/perf/.
//
// Timing contract: each timed run is [flush L2 (unless disabled)] -> [cross-rank host barrier when a World is
// given] -> [align(stream), e.g. loom::barrier_on_stream] -> event -> fn(stream) x reps -> event, divided by reps. The
// per-rank median is reduced to the slowest rank's median over the store, so every rank reports the same figure.
#pragma once

#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/runtime/world.hpp"

namespace loom::bench {

struct TimeOptions {
    int warmup = 5;
    int iters = 30;
    bool flush_l2 = true;
    // With flush_l2: after the memset that evicts L2, read a second buffer of twice L2's size (bench/kernels/
    // l2_flush.cuh), so that the timed region starts with L2 holding clean lines. The memset alone leaves L2 full of
    // dirty lines, whose write-back (about L2's size at the memory's rate, ~12 us on an H200) lands inside the timed
    // region of whatever reads the most: a memory-bound op (a decode GEMM) is timed with it. The read costs ~30 us
    // per run, untimed, and compiles a kernel at first use.
    bool flush_l2_clean = false;
    World* world = nullptr;  // barrier before each run and reduce to the slowest rank
    // Enqueued after the L2 flush and before the start event (e.g. loom::barrier_on_stream): starts the ranks'
    // timed regions together on the device, so the host barrier's skew is not timed.
    std::function<void(cudaStream_t)> align;
    // fn is enqueued `reps` times back to back between the two events and the figure is per call (nccl-tests'
    // way of timing latency: the launch gaps of consecutive calls overlap). 1 = one call per timed run.
    int reps = 1;
};

struct Timing {
    double median_us = 0;  // slowest rank's median when a world is given
    double min_us = 0;
    double p90_us = 0;
    int iters = 0;
};

// Times fn (which enqueues its work on `stream`).
Timing time_op(const std::function<void(cudaStream_t)>& fn, cudaStream_t stream, const TimeOptions& opts = {});
// Times several ops interleaved: each timed run runs them one after the other (each with its own flush, barrier
// and events), so an op and its baseline see the same clocks, power and heat (long GEMMs slow the card down as it
// warms: timed one after the other, the second one paid for it). The order is shuffled per run, the same on every
// rank (a fixed seed), so that a disturbance recurring every few runs does not fall on one op.
std::vector<Timing> time_ops(const std::vector<std::function<void(cudaStream_t)>>& fns, cudaStream_t stream,
                             const TimeOptions& opts = {});

// GB/s (1e9 bytes per second) of `bytes` in `us` microseconds. nccl-tests' bus-bandwidth factors: nccl_args.hpp.
inline double gbps(double bytes, double us) { return bytes / (us * 1e3); }

// Results file: docs/perf/<op>.json with op, command, gpu, commit, date, ranks, rows.
// Each row: "shape" (a string naming the shape; scripts/perf_summary.py --check requires it), further shape/size
// fields, "loom_us", "baselines": {name: us}, "speedup": {name: baseline_us / loom_us}.
class Report {
  public:
    Report(std::string op, int ranks, int argc, char** argv);
    // Adds a row; fills "speedup" from "baselines" and "loom_us" when absent.
    void add_row(nlohmann::json row);
    nlohmann::json to_json() const;
    // Writes the JSON (rank 0 only when ranks > 1 is the caller's business) and says so on stdout; echo_rows also
    // prints every row's JSON there (benchmarks that print a table of their own pass false).
    // path empty: the document is printed to stdout instead (opening "/dev/stdout" as a file would truncate a
    // redirected log).
    void write(const std::string& path, bool echo_rows = true) const;

  private:
    nlohmann::json doc_;
};

std::string gpu_name();  // "NVIDIA H200", or "none"

// Command lines (CLI11). A byte-count option takes 4096, 64K, 16M, 1G or 2GiB (loom::parse_bytes).
CLI::Option* add_bytes_option(CLI::App& app, const std::string& name, std::size_t& target, const std::string& help);
// Parses argv: --help prints the usage and --version the program's and Loom's version, each exiting 0; a bad or
// unknown argument prints why and exits non-zero.
void parse_or_exit(CLI::App& app, int argc, char** argv);

// Absolute path of `rel` (a file of the source tree, e.g. "bench/kernels/lang.cuh"), looked up under
// $LOOM_SOURCE_DIR, then the tree the executable sits in (<root>/<build>/bench/<exe>), then the working directory.
// Benchmarks are often run from a build carried to another machine, so the compile-time path is not enough.
std::string source_file(const std::string& rel);

}  // namespace loom::bench
