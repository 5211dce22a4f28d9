// bench-remote: the language's remote column (docs/language.md, peers on another node through NVSHMEM) against
// NVSHMEM's own device calls, the same pattern in the same timed passes: what Loom's layer over NVSHMEM costs.
//
//   signal round trip   rank 0 and the first rank of node 1 ping-pong --rounds times inside one kernel: Loom's
//                       signal_op_relaxed + signal_wait_until_relaxed (loom_us: NVSHMEM's semantics) and + the
//                       acquire signal_wait_until (loom_acquire_us) against nvshmemx_signal_op +
//                       nvshmem_signal_wait_until; NVSHMEM's pair also on Loom's registered heap
//                       (nvshmem_on_loom_heap_us) and polling the heap's own address
//                       (nvshmem_signal_loom_wait_address_us).
//   put                 rank 0 puts 4 KiB .. --max-bytes into that rank's symmetric memory on --blocks blocks, each
//                       block its chunk at block scope, then completes it: Loom's put(Block) + quiet(Block) against
//                       nvshmemx_putmem_block + nvshmem_quiet. GB/s counts the bytes once.
//
// Needs a World of several nodes: on one machine the emulated mode (docs/crossnode.md), e.g.
//   LOOM_NODE_SIZE=1 build/bin/loomrun -n 2 build/bench/bench-remote --out docs/perf
// Rows to DIR/crossnode.json (rank 0): loom_us, baselines.nvshmem, speedup (NVSHMEM us / Loom us: 1 is no cost).
// On one GPU both ranks share its memory, so the figures are NVSHMEM's path between processes of one GPU, not a
// network's; they measure the layer, and the network's figures come from the performance model's link parameters.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "harness.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/world.hpp"

using loom::bench::Report;
using loom::bench::TimeOptions;
using loom::jit::LaunchConfig;
using nlohmann::json;

namespace {

struct Args {
    std::string out = ".";
    uint32_t rounds = 2000;
    std::size_t max_bytes = std::size_t{256} << 20;
    std::vector<int> blocks = {1, 16};
    int iters = 20;
};

Args parse(int argc, char** argv) {
    Args a;
    CLI::App app{"bench-remote: Loom's remote puts and signals against NVSHMEM's (docs/perf/crossnode.json)"};
    app.add_option("--out", a.out, "output directory")->capture_default_str();
    app.add_option("--rounds", a.rounds, "ping-pong rounds per timed run")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    loom::bench::add_bytes_option(app, "--max-bytes", a.max_bytes, "largest put (>= 4K; default 256M)");
    app.add_option("--blocks", a.blocks, "blocks of the puts")->delimiter(',')->capture_default_str();
    app.add_option("--iters", a.iters, "timed runs per point")->capture_default_str()->check(CLI::PositiveNumber);
    loom::bench::parse_or_exit(app, argc, argv);
    LOOM_CHECK(a.max_bytes >= 4096, "bench-remote: expected --max-bytes >= 4096, given {}", a.max_bytes);
    for (int b : a.blocks) LOOM_CHECK(b >= 1 && b <= 1024, "bench-remote: --blocks: expected 1..1024, given {}", b);
    return a;
}

loom::jit::KernelSpec spec(const std::string& name, bool remote, std::vector<std::string> targs = {}) {
    loom::jit::KernelSpec s;
    s.header = loom::bench::source_file("bench/kernels/remote.cuh");
    s.name = "remote_bench::" + name;
    s.template_args = std::move(targs);
    s.remote_peers = remote;
    s.needs_nvshmem = true;
    return s;
}

void bench(loom::World& w, const Args& args, cudaStream_t stream, int argc, char** argv) {
    const int me = w.rank();
    const int partner = w.local_world_size();  // the first rank of node 1
    const bool active = me == 0 || me == partner;
    Report report("crossnode", w.world_size(), argc, argv);
    const auto& loom_pp = loom::jit::get_kernel(spec("remote_ping_pong", true, {"false"}));
    const auto& loom_pp_acquire = loom::jit::get_kernel(spec("remote_ping_pong", true, {"true"}));
    const auto& nv_pp = loom::jit::get_kernel(spec("nvshmem_ping_pong", false));
    const auto& loom_put = loom::jit::get_kernel(spec("remote_put", true));
    const auto& nv_put = loom::jit::get_kernel(spec("nvshmem_put", false));

    // Loom's operands in its heap; NVSHMEM's from its own symmetric heap (the World initialised NVSHMEM).
    auto* sig = w.alloc<uint64_t>(1);
    char* dst = w.alloc<char>(args.max_bytes);
    char* src = w.alloc<char>(args.max_bytes);
    auto* nsig = static_cast<uint64_t*>(loom::nvshmem::malloc(8));
    auto* ndst = static_cast<char*>(loom::nvshmem::malloc(args.max_bytes));
    auto* nsrc = static_cast<char*>(loom::nvshmem::malloc(args.max_bytes));
    LOOM_CHECK_CUDA(cudaMemset(sig, 0, 8));
    LOOM_CHECK_CUDA(cudaMemset(nsig, 0, 8));
    LOOM_CHECK_CUDA(cudaMemset(src, me + 1, args.max_bytes));
    LOOM_CHECK_CUDA(cudaMemset(nsrc, me + 1, args.max_bytes));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    w.barrier("bench-remote/setup");

    const TimeOptions topts{.warmup = 3, .iters = args.iters, .flush_l2 = false, .world = &w};
    const LaunchConfig one{dim3(1), dim3(1), 0, {1, 1, 1}, stream};
    const int peer_of_me = me == 0 ? partner : 0;
    const int initiator = me == 0;
    // NVSHMEM's calls on Loom's heap (its NVSHMEM alias, registered by the World): whether a difference from NVSHMEM's
    // own heap is Loom's layer or the registered memory. `sig_nv` names the partner's copy of `sig`; the waits poll
    // this rank's copy either through the same alias or through the heap's own address (as Loom's waits do).
    const loom::Ctx ctx = w.ctx();
    auto* sig_nv = reinterpret_cast<uint64_t*>(ctx.remote_heap + ctx.own_offset(sig));
    uint64_t calls[5] = {0, 0, 0, 0, 0};
    auto pp = [&](int v) {
        return [&, v](cudaStream_t) {
            const uint64_t base = calls[v]++ * args.rounds;
            if (!active) return;
            if (v == 0) loom_pp(one, ctx, sig, base, args.rounds, peer_of_me, initiator);
            if (v == 1) nv_pp(one, nsig, nsig, base, args.rounds, peer_of_me, initiator);
            if (v == 2) nv_pp(one, sig_nv, sig_nv, base, args.rounds, peer_of_me, initiator);
            if (v == 3) nv_pp(one, sig_nv, sig, base, args.rounds, peer_of_me, initiator);
            if (v == 4) loom_pp_acquire(one, ctx, sig, base, args.rounds, peer_of_me, initiator);
        };
    };
    // Each variant continues its own counter: reset the two Loom-heap variants' shared signal between them.
    const auto t = loom::bench::time_ops({pp(0), pp(1)}, stream, topts);
    LOOM_CHECK_CUDA(cudaMemset(sig, 0, 8));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    w.barrier("bench-remote/signal-alias");
    const auto ta = loom::bench::time_ops({pp(2)}, stream, topts);
    LOOM_CHECK_CUDA(cudaMemset(sig, 0, 8));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    w.barrier("bench-remote/signal-mixed");
    const auto tm = loom::bench::time_ops({pp(3)}, stream, topts);
    LOOM_CHECK_CUDA(cudaMemset(sig, 0, 8));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    w.barrier("bench-remote/signal-acquire");
    const auto tq = loom::bench::time_ops({pp(4)}, stream, topts);
    const double per = args.rounds;
    report.add_row({{"shape", "signal round trip"},
                    {"metric", "signal_round_trip_us"},
                    {"rounds_per_kernel", args.rounds},
                    {"loom_us", t[0].median_us / per},
                    {"loom_acquire_us", tq[0].median_us / per},
                    {"nvshmem_on_loom_heap_us", ta[0].median_us / per},
                    {"nvshmem_signal_loom_wait_address_us", tm[0].median_us / per},
                    {"baselines", {{"nvshmem", t[1].median_us / per}}}});
    if (me == 0)
        std::printf(
            "signal round trip: loom %.2f us (acquire wait %.2f us), nvshmem %.2f us; nvshmem's calls on Loom's heap "
            "%.2f us, polling the heap's own address %.2f us\n",
            t[0].median_us / per, tq[0].median_us / per, t[1].median_us / per, ta[0].median_us / per,
            tm[0].median_us / per);

    for (int blocks : args.blocks)
        for (std::size_t bytes = 4096; bytes <= args.max_bytes; bytes *= 4) {
            const LaunchConfig lc{dim3(static_cast<unsigned>(blocks)), dim3(256), 0, {1, 1, 1}, stream};
            const auto p =
                loom::bench::time_ops({[&](cudaStream_t) {
                                           if (me == 0)
                                               loom_put(lc, w.ctx(), dst, src, static_cast<uint64_t>(bytes), partner);
                                       },
                                       [&](cudaStream_t) {
                                           if (me == 0) nv_put(lc, ndst, nsrc, static_cast<uint64_t>(bytes), partner);
                                       }},
                                      stream, topts);
            const double gbps = static_cast<double>(bytes) / p[0].median_us / 1e3;
            report.add_row({{"shape", fmt::format("put {} B, {} blocks", bytes, blocks)},
                            {"metric", "put_us"},
                            {"bytes", bytes},
                            {"blocks", blocks},
                            {"loom_us", p[0].median_us},
                            {"loom_gbps", gbps},
                            {"nvshmem_gbps", static_cast<double>(bytes) / p[1].median_us / 1e3},
                            {"baselines", {{"nvshmem", p[1].median_us}}}});
            if (me == 0)
                std::printf("put %10zu B %4d blocks: loom %9.2f us (%7.1f GB/s), nvshmem %9.2f us\n", bytes, blocks,
                            p[0].median_us, gbps, p[1].median_us);
            if (bytes > args.max_bytes / 4) break;
        }

    // Each rank checks what it received: rank 0's bytes (value 1) in both destinations of the partner.
    if (me == partner) {
        std::vector<char> a(4096), b(4096);
        LOOM_CHECK_CUDA(cudaMemcpy(a.data(), dst, a.size(), cudaMemcpyDeviceToHost));
        LOOM_CHECK_CUDA(cudaMemcpy(b.data(), ndst, b.size(), cudaMemcpyDeviceToHost));
        LOOM_CHECK(std::all_of(a.begin(), a.end(), [](char c) { return c == 1; }) &&
                       std::all_of(b.begin(), b.end(), [](char c) { return c == 1; }),
                   "bench-remote: the partner's destinations do not hold rank 0's bytes");
    }
    w.barrier("bench-remote/done");
    if (me == 0) report.write(args.out + "/crossnode.json");
    loom::nvshmem::free(nsrc);
    loom::nvshmem::free(ndst);
    loom::nvshmem::free(nsig);
    w.free(src);
    w.free(dst);
    w.free(sig);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Args args = parse(argc, argv);
        if (!loom::driver::available()) {
            std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
            return 1;
        }
        loom::WorldOptions opts;
        opts.symmetric_size = std::max(loom::settings().symmetric_size, 2 * args.max_bytes + (std::size_t{64} << 20));
        loom::World world = loom::World::from_env(opts);
        LOOM_CHECK(world.num_nodes() >= 2,
                   "bench-remote: expected a World of at least 2 nodes (e.g. LOOM_NODE_SIZE=1 loomrun -n 2), given "
                   "{} rank(s) on {} node(s)",
                   world.world_size(), world.num_nodes());
        std::filesystem::create_directories(args.out);
        cudaStream_t stream;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        bench(world, args, stream, argc, argv);
        LOOM_CHECK_CUDA(cudaStreamDestroy(stream));
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench-remote: %s\n", e.what());
        return 1;
    }
}
