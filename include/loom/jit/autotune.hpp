// Config choice for an op: an analytic heuristic first, then an optional empirical autotuner.
//
// An op offers candidate configs (a name and a config string, JSON or free-form) and the index of its
// heuristic default. Without LOOM_AUTOTUNE=1, autotune() returns the persisted winner for this key when one
// exists and is still a candidate, else the heuristic: no timing, no communication. With LOOM_AUTOTUNE=1 it
// is COLLECTIVE over the World (every rank calls it with the same op, bucket and candidates, in the same order
// as its other autotune calls): each rank times every candidate with `time_us` (`rounds` times), the times are
// all-gathered through the World's store, a candidate's cost is its slowest rank's time, rank 0 picks the cheapest and
// publishes it, and every rank returns that candidate. The winner is persisted (rank 0) as JSON under
// LOOM_CACHE_DIR/tune/<op>/ keyed by op, shape bucket, world size, arch and versions.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace loom {
class World;
}

namespace loom::jit {

struct TuneCandidate {
    std::string name;    // short and unique among the candidates: "128x256x4"
    std::string config;  // what the op needs to rebuild it (JSON or any string)
};

struct TuneRequest {
    std::string op;            // "gemm", "ag_gemm", ...
    std::string shape_bucket;  // from shape_bucket(): problems in one bucket share a winner
    int arch = 0;              // current_arch() of the device the op runs on
    std::vector<TuneCandidate> candidates;
    std::size_t heuristic = 0;  // index of the heuristic default in candidates
    // Times one candidate on this rank, in microseconds (e.g. loom::bench::time_op's median). A candidate
    // that cannot run here throws loom::Error (or returns a non-finite value): it is then never chosen.
    std::function<double(const TuneCandidate&)> time_us;
    // Timing rounds (LOOM_AUTOTUNE=1): every candidate is timed `rounds` times, round r visiting the candidates from
    // index r * n / rounds on (rotated), and costs the median of its rounds. A GPU warms and slows down over a
    // tuning run, so a candidate timed later reads slower: measured, the first of nine identical-cost GEMM+RS
    // candidates read 11 % faster than its twin timed fourth. Rotation puts every candidate early and late.
    int rounds = 1;
};

struct TuneResult {
    TuneCandidate choice;
    std::size_t index = 0;
    std::string source;  // "heuristic", "persisted" or "tuned"
    double us = 0;       // the winner's slowest-rank time ("tuned" and "persisted"); 0 for the heuristic
};

// See the contract at the top of this file. `world` may be null (single process).
TuneResult autotune(const TuneRequest& req, World* world = nullptr);

// A shape bucket name: each dimension rounded up to a power of two, "m4096_n8192_k8192".
std::string shape_bucket(std::initializer_list<std::pair<const char*, long long>> dims);

// The file a tuning result for (op, bucket, world size, arch) is kept in.
std::string tune_file(const std::string& op, const std::string& shape_bucket, int world_size, int arch);

}  // namespace loom::jit
