// The intra-kernel profiler on the GPU (docs/profiling.md), under loomrun at 2, 4 and 8 ranks, on one node or on
// LOOM_NODE_SIZE's emulated nodes: a profiled ag_gemm writes one trace whose GEMM spans cover every tile of the GEMM
// launches on every rank, and its output is bitwise the unprofiled call's; a profiled all_reduce (across nodes the
// hierarchical form's kernels) leaves its collective spans on every rank, same output. Inputs are fresh
// random values, outputs poisoned first; every rank's verdict is agreed through the store.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "common/trace_check.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/profile.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;

class Profile : public ::WorldStreamTest {
  protected:
    void TearDown() override {
        profile::set_enabled(false);
        ::WorldStreamTest::TearDown();
    }
};

struct Dev {
    void* p = nullptr;
    explicit Dev(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
    ~Dev() { cudaFree(p); }
};

void upload_random_bf16(void* dst, std::size_t n, std::uint64_t seed) {
    const std::vector<float> f = test::random_floats(n, seed);
    std::vector<std::uint16_t> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = test::float_to_bf16(f[i]);
    test::upload(dst, h);
}

std::vector<std::uint8_t> download(const void* src, std::size_t bytes) {
    std::vector<std::uint8_t> h(bytes);
    EXPECT_EQ(cudaMemcpy(h.data(), src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

// A failed stream raises (the caller's verdict then still reaches the peers).
void sync(cudaStream_t s) {
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) throw std::runtime_error(std::string("stream: ") + cudaGetErrorString(e));
}

// Every rank's trace path (only rank 0's is written) in a directory of this process.
fs::path trace_path(const std::string& name) {
    const fs::path dir = fs::temp_directory_path() / ("loom_profile_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    return dir / name;
}

nlohmann::json read_json(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
}

// The tiles (m_block, n_block) of 128 x 128 that a rank's GEMM launches of an ag_gemm of M x n cover, with their
// multiplicity: one launch over the M rows on one node; across nodes (ag_gemm's two-level form,
// src/ops/overlap/ag_gemm/across_nodes.cpp) one over the node's node_rows rows from row0 and one each over the other
// nodes' rows before and after them, every launch numbering its m-blocks from 0.
std::map<std::pair<int64_t, int64_t>, int> expected_tiles(int64_t M, int64_t n, int64_t node_rows, int64_t row0) {
    std::map<std::pair<int64_t, int64_t>, int> tiles;
    auto launch = [&](int64_t rows) {
        for (int64_t mb = 0; mb < (rows + 127) / 128; ++mb)
            for (int64_t nb = 0; nb < (n + 127) / 128; ++nb) ++tiles[{mb, nb}];
    };
    launch(node_rows);
    if (row0 > 0) launch(row0);
    if (row0 + node_rows < M) launch(M - row0 - node_rows);
    return tiles;
}

TEST_F(Profile, AgGemmTraceCoversEveryTile) {
    World& world = *w;
    const int W = world.world_size(), me = world.rank();
    const int64_t rows = 256, n = 384, k = 512, M = rows * W;
    // A fixed 128 x 128 tile, so that the test knows the tile grid.
    GemmConfig cfg = gemm_heuristic(M, n, k, false, 90, 132);
    cfg.block_m = 128;
    cfg.block_n = 128;
    cfg.stages = kernels::gemm_sm90_plan_stages(cfg.block_m, cfg.block_n);
    cfg.cluster_m = 1;
    cfg.tma_store = true;
    cfg.tail_splits = 1;
    cfg.grid = 0;
    AgGemmOptions opts;
    opts.config = &cfg;
    const std::uint64_t seed = std::random_device{}();
    Dev a(rows * k * 2), b(n * k * 2), plain(M * n * 2), profiled(M * n * 2);
    upload_random_bf16(a.p, rows * k, seed + 2 * me);
    upload_random_bf16(b.p, n * k, seed + 2 * me + 1);
    EXPECT_EQ(cudaMemset(plain.p, 0xff, M * n * 2), cudaSuccess);  // NaN poison
    EXPECT_EQ(cudaMemset(profiled.p, 0xff, M * n * 2), cudaSuccess);
    const MatrixView A{a.p, DType::BF16, rows, k, 0}, B{b.p, DType::BF16, n, k, 0};

    std::string err;
    std::string path;
    try {
        profile::set_enabled(false);
        ag_gemm(world, A, B, MatrixView{plain.p, DType::BF16, M, n, 0}, stream, opts);
        sync(stream);
        profile::clear();
        profile::set_enabled(true);
        ag_gemm(world, A, B, MatrixView{profiled.p, DType::BF16, M, n, 0}, stream, opts);
        sync(stream);
        profile::set_enabled(false);
        path = profile::write_trace(world, trace_path("ag_gemm.json").string());
    } catch (const std::exception& e) {
        err = e.what();
    }
    if (err.empty() && download(plain.p, M * n * 2) != download(profiled.p, M * n * 2))
        err = "the profiled ag_gemm's output differs from the unprofiled one";
    if (err.empty() && path.empty()) err = "no trace written";
    if (err.empty() && me == 0) try {  // an error here must reach the agreement, not leave the peers waiting
            const nlohmann::json trace = read_json(path);
            err = loom_test::check_trace(trace);
            const auto tiles = loom_test::span_args(trace, "gemm.tile");
            const auto waits = loom_test::span_args(trace, "ag_gemm.chunk_wait");
            const int L = world.local_world_size();
            for (int r = 0; r < W && err.empty(); ++r) {
                const auto want = expected_tiles(M, n, rows * L, rows * L * (r / L));
                std::map<std::pair<int64_t, int64_t>, int> seen;
                if (auto it = tiles.find(r); it != tiles.end())
                    for (const auto& args : it->second)
                        ++seen[{args.at("m_block").get<int64_t>(), args.at("n_block").get<int64_t>()}];
                for (const auto& [tile, count] : want) {
                    const auto it = seen.find(tile);
                    const int got = it == seen.end() ? 0 : it->second;
                    if (err.empty() && got != 2 * count)  // two consumer warpgroups per tile
                        err = fmt::format("rank {}: tile ({}, {}) has {} spans, expected {} (2 per launch covering it)",
                                          r, tile.first, tile.second, got, 2 * count);
                }
                if (err.empty() && seen.size() != want.size())
                    err = fmt::format("rank {}: spans of {} distinct tiles, expected {}", r, seen.size(), want.size());
                // The node's GEMM waits for its node's peers' rows (one node: every peer's).
                if (err.empty() && L > 1 && !waits.count(r))
                    err = fmt::format("rank {}: no ag_gemm.chunk_wait span", r);
            }
            if (err.empty()) std::printf("profile trace: %s\n", path.c_str());
        } catch (const std::exception& e) {
            err = std::string("reading the trace: ") + e.what();
        }
    const std::string verdict = test::agree(world, err, "test/profile/ag_gemm");
    EXPECT_EQ(verdict, "");
}

TEST_F(Profile, AllReduceTraceHasEveryRank) {
    World& world = *w;
    const int W = world.world_size(), me = world.rank();
    const std::size_t count = std::size_t{1} << 20;
    void* in = world.alloc_bytes(count * 2);
    void* out = world.alloc_bytes(count * 2);
    void* out2 = world.alloc_bytes(count * 2);
    upload_random_bf16(in, count, std::random_device{}() + me);
    EXPECT_EQ(cudaMemset(out, 0xff, count * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(out2, 0xff, count * 2), cudaSuccess);
    world.barrier();
    std::string err, path;
    try {
        profile::set_enabled(false);
        all_reduce(world, {in, DType::BF16, count}, {out, DType::BF16, count}, stream);
        sync(stream);
        profile::clear();
        profile::set_enabled(true);
        all_reduce(world, {in, DType::BF16, count}, {out2, DType::BF16, count}, stream);
        sync(stream);
        profile::set_enabled(false);
        path = profile::write_trace(world, trace_path("all_reduce.json").string());
    } catch (const std::exception& e) {
        err = e.what();
    }
    if (err.empty() && download(out, count * 2) != download(out2, count * 2))
        err = "the profiled all_reduce's output differs from the unprofiled one";
    if (err.empty() && path.empty()) err = "no trace written";
    if (err.empty() && me == 0) try {  // an error here must reach the agreement, not leave the peers waiting
            const nlohmann::json trace = read_json(path);
            err = loom_test::check_trace(trace);
            std::set<int> ranks;
            for (const auto& e : trace["traceEvents"])
                if (e["ph"] == "B" && e["name"].get<std::string>().rfind("coll.", 0) == 0)
                    ranks.insert(e["pid"].get<int>());
            if (err.empty() && static_cast<int>(ranks.size()) != W)
                err = fmt::format("collective spans on {} of {} ranks", ranks.size(), W);
        } catch (const std::exception& e) {
            err = std::string("reading the trace: ") + e.what();
        }
    const std::string verdict = test::agree(world, err, "test/profile/all_reduce");
    world.barrier();
    world.free(out2);
    world.free(out);
    world.free(in);
    EXPECT_EQ(verdict, "");
}

}  // namespace
}  // namespace loom
