// loom_test_child: the child processes of tests whose subject ends or shares the process (a kernel that traps leaves
// its CUDA context unusable; cache writers must be separate processes). Tests start it through
// tests/common/child_process.hpp and check its exit status and output. The child never joins the parent's job: it
// has no World, a one-rank World that hosts its own store, or (ce-skip-collective) a World of two children.
//   usage: loom_test_child <case>
//     lang-missing-notify  a block waits for a signal nobody sends, on a one-rank Ctx without a World; the kernel
//                          prints the timeout diagnostic and traps. Exit 3: the synchronising call failed.
//     diag-missing-notify  the same wait in a kernel compiled with LOOM_NO_DEVICE_PRINTF, in a one-rank World with
//                          the diagnostic mailbox: the loom::Error of the synchronising call
//                          and the World's shutdown warning carry the decoded record. Exit 3: the call raised.
//     lang-missing-notify-26  the same wait in 26 blocks (a collective's block count on a shared GPU): one summary
//                          line at the default log level, each block's own line only at LOOM_LOG_LEVEL=debug.
//     ce-skip-collective   one rank of a two-rank job (LOOM_RANK, LOOM_MASTER_PORT, ... from the parent): both ranks
//                          make all_gather call 1 through the copy engine; rank 1 then skips call 2 and sleeps
//                          (LOOM_WAIT_TIMEOUT_MS + 15 s, exit 0); rank 0 prints "ce-skip: call 2 enqueued at <ns>"
//                          (steady clock) and synchronises, which the stream watchdog ends: SIGABRT after its
//                          diagnostic. Exit 4: the call completed.
//     moe-bad-expert       moe_route over ids with one out of range, in a one-rank World (the mailbox): the
//                          synchronising call raises with the "bad index ... moe_route topk_idx" record. Exit 3.
//     jit-cache-writer     compiles tests/unit/kernels/jit_add.cuh's add_n<11, float> for sm_90 into the cache
//                          (LOOM_CACHE_DIR; no GPU needed): one of several concurrent writers. Exit 0: a cubin.
//     decode-bad-page      decode_attention over a paged cache whose block table holds page 99 of 8 (sequence 1,
//     decode-bad-len       entry 2) / a contiguous cache of 32 tokens with seq_lens[0] = 40: the kernel prints the
//                          named error and traps. Exit 3: the synchronising call failed.
//     xnode-undeclared-remote  tests/dist/kernels/crossnode.cuh's touch_peer_undeclared (compiled without remote
//                          peers) on a one-rank Ctx of two nodes (rank 0 of 2, one rank per node) notifying peer 1:
//                          symm_at prints that peer 1 is on node 1 and traps. Exit 3: the synchronising call failed.
//     lang-put-past-heap   a put of 64 bytes starting 16 bytes before the end of a one-rank Ctx's heap (block group,
//                          ld/st path): the range check prints the last byte as outside the heap and traps. Exit 3.
//     ep-ll-bad-expert     ep_ll_dispatch in a one-rank World (the mailbox) over ids with one equal to E / where every
//     ep-ll-capacity       token names expert 0 twice (2 x max_tokens entries for max_tokens slots): the synchronising
//                          call raises with the "bad index ... ep_ll_dispatch topk_idx" / "... ep_ll_dispatch expert
//                          capacity (max_tokens) topk_idx" record. Exit 3.
//   Exit 4: a kernel that should have trapped completed; 2: a usage or set-up error. The wait bound is
//   LOOM_WAIT_TIMEOUT_MS (the tests pass 300; 0 counts as 300 ms, so that the kernel times out).
#include <cuda_runtime.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "common/test_kernels.hpp"
#include "loom/ops/attention.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/moe.hpp"
#include "loom/ops/moe_ep_ll.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/world.hpp"

namespace {

constexpr int kRaised = 3;
constexpr int kCompleted = 4;
constexpr int kSetupError = 2;

using loom::jit::LaunchConfig;

std::uint64_t wait_timeout_ns() {
    const auto ms = loom::settings().wait_timeout.count();
    return static_cast<std::uint64_t>(ms > 0 ? ms : 300) * 1000000ull;
}

[[noreturn]] void leave(int status) {
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(status);  // no teardown: the context holds a sticky error
}

// A Ctx of rank 0 alone, without a World: its heap the first `heap` bytes of a zeroed cudaMalloc'd buffer of
// heap + extra bytes (heap[0]; the rest lies outside the heap).
loom::Ctx plain_ctx(std::size_t heap, std::size_t extra = 0) {
    char* buf = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&buf, heap + extra));
    LOOM_CHECK_CUDA(cudaMemset(buf, 0, heap + extra));
    loom::Ctx ctx{};
    ctx.rank = 0;
    ctx.world = ctx.local_world = 1;
    ctx.heap_size = heap;
    ctx.heap[0] = buf;
    ctx.wait_timeout_ns = wait_timeout_ns();
    return ctx;
}

// The wait of tests/dist/kernels/lang_test.cuh's missing_notify on a Ctx of one rank over a plain allocation, in
// `blocks` blocks.
[[noreturn]] void lang_missing_notify(unsigned blocks) {
    const loom::Ctx ctx = plain_ctx(1 << 20);
    loom::test::lang_kernel("loom_test::missing_notify")(LaunchConfig{dim3(blocks), dim3(64)}, ctx,
                                                         reinterpret_cast<std::uint64_t*>(ctx.heap[0]));
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("lang-child: the kernel ended: %s\n", cudaGetErrorString(e));
    leave(e == cudaSuccess ? kCompleted : kRaised);
}

// A put whose range runs past the end of the symmetric heap (tests/dist/kernels/lang_test.cuh's move).
[[noreturn]] void lang_put_past_heap() {
    const std::size_t heap = 1 << 20;
    const loom::Ctx ctx = plain_ctx(heap, 4096);  // the heap, then a source outside it
    char* const buf = ctx.heap[0];
    constexpr int kPut = 0;  // loom_test::Op::Put
    loom::test::lang_kernel("loom_test::move", {"loom::lang::Block", "0"})(
        LaunchConfig{dim3(1), dim3(256)}, ctx, kPut, buf + heap - 16, static_cast<const char*>(buf + heap),
        std::uint64_t{64}, 0, reinterpret_cast<std::uint64_t*>(buf), std::uint64_t{1});
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("lang-child: the kernel ended: %s\n", cudaGetErrorString(e));
    leave(e == cudaSuccess ? kCompleted : kRaised);
}

// A notify to a peer on another node from a kernel compiled without remote peers, on a Ctx of two one-rank nodes.
[[noreturn]] void xnode_undeclared_remote() {
    loom::Ctx ctx = plain_ctx(1 << 20);
    ctx.world = 2;  // rank 1 is the other node's only rank
    loom::test::test_kernel("tests/dist/kernels/crossnode.cuh", "xnode_test::touch_peer_undeclared")(
        LaunchConfig{dim3(1), dim3(32)}, ctx, reinterpret_cast<std::uint64_t*>(ctx.heap[0]), 1);
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("xnode-child: the kernel ended: %s\n", cudaGetErrorString(e));
    leave(e == cudaSuccess ? kCompleted : kRaised);
}

// A one-rank World that hosts its own store on a free port.
loom::World solo_world() {
    loom::RankInfo info;
    info.master_port = 0;
    info.source = "test";
    loom::WorldOptions opts;
    opts.symmetric_size = std::size_t{64} << 20;
    return loom::World(info, opts);
}

// tests/dist/kernels/diag_test.cuh's missing_notify (no device printf): the synchronising call must raise. Prints
// the error, then shuts the World down, which synchronises again and warns with the mailbox report (stderr).
[[noreturn]] void diag_missing_notify() {
    loom::World w = solo_world();
    auto* sig = w.alloc<std::uint64_t>(1);
    LOOM_CHECK_CUDA(cudaMemset(sig, 0, 8));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    try {
        loom::test::test_kernel("tests/dist/kernels/diag_test.cuh", "loom_diag_test::missing_notify")(
            LaunchConfig{dim3(1), dim3(64)}, w.ctx(), sig);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    } catch (const loom::Error& e) {
        std::printf("diag-child: loom::Error: %s\n", e.what());
        std::fflush(stdout);
        w.shutdown();
        leave(kRaised);
    }
    std::printf("diag-child: the kernel completed; expected a timeout\n");
    leave(kCompleted);
}

// Rank 1 of the two skips all_gather call 2; rank 0 waits for it in the copy engine's stream waits, which only the
// host watchdog bounds.
[[noreturn]] void ce_skip_collective() {
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // the abort must not spend seconds writing a core file
    loom::WorldOptions opts;
    opts.symmetric_size = std::size_t{64} << 20;
    loom::World w = loom::World::from_env(opts);
    const std::size_t n = std::size_t{1} << 20;  // bytes per rank
    auto* in = w.alloc<std::uint8_t>(n);
    auto* out = w.alloc<std::uint8_t>(2 * n);
    LOOM_CHECK_CUDA(cudaMemset(in, w.rank() + 1, n));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    cudaStream_t s = nullptr;
    LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    loom::CollOptions o;
    o.algo = loom::CollAlgo::Push;
    o.path = loom::DataPath::CopyEngine;
    const loom::BufferView inv{in, loom::DType::U8, n}, outv{out, loom::DType::U8, 2 * n};
    loom::all_gather(w, inv, outv, s, o);  // call 1, every rank: creates the state
    LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
    w.barrier("ce-skip: call 1 done");
    if (w.rank() != 0) {
        std::printf("ce-skip: rank %d skips call 2\n", w.rank());
        std::fflush(stdout);
        const auto ms = loom::settings().wait_timeout.count();
        std::this_thread::sleep_for(std::chrono::milliseconds(ms + 15000));
        leave(0);
    }
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    std::printf("ce-skip: call 2 enqueued at %lld ns\n",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
    std::fflush(stdout);
    loom::all_gather(w, inv, outv, s, o);
    const cudaError_t e = cudaStreamSynchronize(s);
    std::printf("ce-skip: call 2 ended: %s\n", cudaGetErrorString(e));
    leave(kCompleted);
}

// Token 5's second slot names expert 8 of 8: moe_route's count kernel traps with a BadIndex record.
[[noreturn]] void moe_bad_expert() {
    loom::World w = solo_world();
    const loom::MoeRoutingShape shape{16, 2, 8};
    std::vector<std::int32_t> idx(32);
    for (int j = 0; j < 32; ++j) idx[j] = j % 8;
    idx[11] = 8;
    std::int32_t* d_idx = nullptr;
    void* buf = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&d_idx, idx.size() * 4));
    LOOM_CHECK_CUDA(cudaMalloc(&buf, loom::moe_routing_bytes(shape)));
    LOOM_CHECK_CUDA(cudaMemcpy(d_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    try {
        loom::moe_route(d_idx, nullptr, loom::moe_routing_view(shape, buf, loom::moe_routing_bytes(shape)), nullptr);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    } catch (const loom::Error& e) {
        std::printf("moe-child: loom::Error: %s\n", e.what());
        leave(kRaised);
    }
    std::printf("moe-child: moe_route completed; expected a trap\n");
    leave(kCompleted);
}

[[noreturn]] void ep_ll_bad_routing(bool capacity) {
    loom::World w = solo_world();
    const loom::EpLowLatencyShape shape{4, 128, 2, 2};
    std::vector<std::int32_t> idx = {0, 1, 1, 0, 0, 1, 1, 0};
    if (capacity)
        idx.assign(8, 0);
    else
        idx[5] = 2;
    std::int32_t* d_idx = nullptr;
    void* x = nullptr;
    loom::EpLowLatencyRecv recv;
    LOOM_CHECK_CUDA(cudaMalloc(&d_idx, idx.size() * 4));
    LOOM_CHECK_CUDA(cudaMalloc(&x, 4 * 128 * 2));
    LOOM_CHECK_CUDA(cudaMemset(x, 0, 4 * 128 * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&recv.x, loom::ep_ll_recv_x_bytes(shape, 1, true)));
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&recv.scales), loom::ep_ll_recv_scales_bytes(shape, 1)));
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&recv.src_info), loom::ep_ll_recv_src_info_bytes(shape, 1)));
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&recv.counts), loom::ep_ll_recv_counts_bytes(shape, 1)));
    LOOM_CHECK_CUDA(cudaMemcpy(d_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    try {
        loom::ep_ll_dispatch(w, {x, loom::DType::BF16, 4, 128, 0}, d_idx, shape, recv, nullptr);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    } catch (const loom::Error& e) {
        std::printf("ep-ll-child: loom::Error: %s\n", e.what());
        leave(kRaised);
    }
    std::printf("ep-ll-child: ep_ll_dispatch completed; expected a trap\n");
    leave(kCompleted);
}

[[noreturn]] void jit_cache_writer() {
    loom::jit::KernelSpec spec;
    spec.header = LOOM_SOURCE_DIR "/tests/unit/kernels/jit_add.cuh";
    spec.name = "jit_test::add_n";
    spec.template_args = {"11", "float"};
    leave(loom::jit::compile(spec, 90).cubin.empty() ? 1 : 0);
}

// decode_attention on device data the host cannot check: a block-table entry or a length out of range.
void decode_bad_device_data(bool bad_page) {
    const int B = 2, H = 8, D = 64, page = 16, pages = 8, max_pages = 4;
    void *q = nullptr, *o = nullptr, *kv = nullptr, *lens = nullptr, *table = nullptr;
    const std::size_t kv_bytes = std::size_t(pages) * page * H * D * 2;
    if (cudaMalloc(&q, B * H * D * 2) || cudaMalloc(&o, B * H * D * 2) || cudaMalloc(&kv, kv_bytes) ||
        cudaMalloc(&lens, B * 4) || cudaMalloc(&table, B * max_pages * 4))
        leave(kSetupError);
    cudaMemset(q, 0, B * H * D * 2);
    cudaMemset(kv, 0, kv_bytes);
    const int32_t h_lens[B] = {bad_page ? 10 : 40, bad_page ? 40 : 3};
    const int32_t h_table[B * max_pages] = {0, 1, 2, 3, 4, 5, 99, 7};
    cudaMemcpy(lens, h_lens, sizeof(h_lens), cudaMemcpyHostToDevice);
    cudaMemcpy(table, h_table, sizeof(h_table), cudaMemcpyHostToDevice);
    loom::KvCache c;
    c.k = c.v = kv;
    c.num_kv_heads = H;
    c.seq_lens = static_cast<const int32_t*>(lens);
    if (bad_page) {
        c.block_table = static_cast<const int32_t*>(table);
        c.max_pages = max_pages;
        c.num_pages = pages;
        c.page_size = page;
    } else {
        c.max_seq_len = 32;  // 2 x 32 tokens fit in kv
    }
    loom::decode_attention({q, loom::DType::BF16, B, H, D}, c, o, nullptr, nullptr);
    leave(cudaDeviceSynchronize() != cudaSuccess ? kRaised : kCompleted);
}

}  // namespace

int main(int argc, char** argv) {
    const std::string which = argc == 2 ? argv[1] : "";
    try {
        if (which == "lang-missing-notify") lang_missing_notify(1);
        if (which == "lang-missing-notify-26") lang_missing_notify(26);
        if (which == "xnode-undeclared-remote") xnode_undeclared_remote();
        if (which == "lang-put-past-heap") lang_put_past_heap();
        if (which == "ce-skip-collective") ce_skip_collective();
        if (which == "diag-missing-notify") diag_missing_notify();
        if (which == "jit-cache-writer") jit_cache_writer();
        if (which == "moe-bad-expert") moe_bad_expert();
        if (which == "ep-ll-bad-expert") ep_ll_bad_routing(false);
        if (which == "ep-ll-capacity") ep_ll_bad_routing(true);
        if (which == "decode-bad-page") decode_bad_device_data(true);
        if (which == "decode-bad-len") decode_bad_device_data(false);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "loom_test_child %s: %s\n", which.c_str(), e.what());
        return kSetupError;
    }
    std::fprintf(
        stderr,
        "usage: loom_test_child lang-missing-notify|lang-missing-notify-26|lang-put-past-heap|xnode-undeclared-remote|"
        "ce-skip-collective|diag-missing-notify|jit-cache-writer|moe-bad-expert|ep-ll-bad-expert|"
        "ep-ll-capacity|decode-bad-page|decode-bad-len\n");
    return kSetupError;
}
