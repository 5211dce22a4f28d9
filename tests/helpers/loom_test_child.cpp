// loom_test_child: the child processes of tests whose subject ends or shares the process (a kernel that traps leaves
// its CUDA context unusable; cache writers must be separate processes). Tests start it through
// tests/common/child_process.hpp and check its exit status and output. The child never joins the parent's job: it
// has no World, or a one-rank World that hosts its own store.
//   usage: loom_test_child <case>
//     lang-missing-notify  a block waits for a signal nobody sends, on a one-rank Ctx without a World; the kernel
//                          prints the timeout diagnostic and traps. Exit 3: the synchronising call failed.
//     diag-missing-notify  the same wait in a kernel compiled with LOOM_NO_DEVICE_PRINTF, in a one-rank World with
//                          the diagnostic mailbox (LOOM_DIAG_MAILBOX=1): the loom::Error of the synchronising call
//                          and the World's shutdown warning carry the decoded record. Exit 3: the call raised.
//     jit-cache-writer     compiles tests/unit/kernels/jit_add.cuh's add_n<11, float> for sm_90 into the cache
//                          (LOOM_CACHE_DIR; no GPU needed): one of several concurrent writers. Exit 0: a cubin.
//   Exit 4: a kernel that should have trapped completed; 2: a usage or set-up error. The wait bound is
//   LOOM_WAIT_TIMEOUT_MS (300 ms when unset).
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "common/test_kernels.hpp"
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

// The wait of tests/dist/kernels/lang_test.cuh's missing_notify on a Ctx of one rank over a plain allocation.
[[noreturn]] void lang_missing_notify() {
    const std::size_t heap = 1 << 20;
    char* buf = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&buf, heap));
    LOOM_CHECK_CUDA(cudaMemset(buf, 0, heap));
    loom::Ctx ctx{};
    ctx.rank = 0;
    ctx.world = ctx.local_world = 1;
    ctx.heap_size = heap;
    ctx.heap[0] = buf;
    ctx.wait_timeout_ns = wait_timeout_ns();
    loom::test::lang_kernel("loom_test::missing_notify")(LaunchConfig{dim3(1), dim3(64)}, ctx,
                                                         reinterpret_cast<std::uint64_t*>(buf));
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("lang-child: the kernel ended: %s\n", cudaGetErrorString(e));
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

[[noreturn]] void jit_cache_writer() {
    loom::jit::KernelSpec spec;
    spec.header = LOOM_SOURCE_DIR "/tests/unit/kernels/jit_add.cuh";
    spec.name = "jit_test::add_n";
    spec.template_args = {"11", "float"};
    leave(loom::jit::compile(spec, 90).cubin.empty() ? 1 : 0);
}

}  // namespace

int main(int argc, char** argv) {
    const std::string which = argc == 2 ? argv[1] : "";
    try {
        if (which == "lang-missing-notify") lang_missing_notify();
        if (which == "diag-missing-notify") diag_missing_notify();
        if (which == "jit-cache-writer") jit_cache_writer();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "loom_test_child %s: %s\n", which.c_str(), e.what());
        return kSetupError;
    }
    std::fprintf(stderr, "usage: loom_test_child lang-missing-notify|diag-missing-notify|jit-cache-writer\n");
    return kSetupError;
}
