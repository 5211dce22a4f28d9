// Probe: a tile pipeline whose producer never arrives ends in a loom::Error carrying the decoded mailbox record of
// the stalled mbarrier wait. Every consumer thread times out after kMbarrierTimeoutCycles (~17 s at ~2 GHz),
// records through the module global the JIT binds at load (the kernel has no Ctx) and traps. One process, one GPU,
// a one-rank World; run it alone (a trap inside an MPS client faults every client of the GPU).
//   build/bench/probe-pipeline-stall     exit 0: the error names the stalled mbarrier wait
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

int main() {
    loom::RankInfo info;
    info.master_port = 0;  // its own store on a free port
    info.source = "probe";
    loom::WorldOptions opts;
    opts.symmetric_size = std::size_t{64} << 20;
    loom::World w(info, opts);  // before get_kernel: the module global is bound at load
    loom::jit::KernelSpec spec;
    spec.header = LOOM_SOURCE_DIR "/tests/dist/kernels/diag_test.cuh";
    spec.name = "loom_diag_test::pipeline_stall";
    std::string error;
    try {
        loom::jit::get_kernel(spec)(loom::jit::LaunchConfig{dim3(2), dim3(128)});
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    } catch (const loom::Error& e) {
        error = e.what();
    }
    std::printf("%s\n", error.empty() ? "the kernel completed; expected a timeout" : error.c_str());
    // How many of the 256 waiters record before the first trap stops the kernel depends on timing; one is enough.
    const bool ok = error.find("wait timeout: rank 0 block (") != std::string::npos &&
                    error.find("tag pipeline full at 0x") != std::string::npos &&
                    error.find("(mbarrier) expected the phase with parity 0 to complete") != std::string::npos;
    std::printf("%s\n", ok ? "probe-pipeline-stall: the stalled mbarrier wait is decoded"
                           : "probe-pipeline-stall: FAILED: no decoded mbarrier record");
    std::fflush(stdout);
    w.shutdown();  // synchronises again: its warning repeats the mailbox report
    std::fflush(nullptr);
    std::_Exit(ok ? 0 : 1);  // no teardown: the context holds a sticky error
}
