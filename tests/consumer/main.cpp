// Uses the installed package: parses rank facts and JIT-compiles a tiny kernel for sm_90a against Loom's
// embedded headers, proving the installed library compiles kernels without Loom's source tree.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "loom/jit/jit.hpp"
#include "loom/runtime/env.hpp"

int main() try {
    loom::RankInfo info = loom::rank_info_from_env();
    // A user kernel written to a temporary directory: it includes Loom headers that exist only in libloom.
    auto dir = std::filesystem::temp_directory_path() / "loom_consumer";
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "consumer_kernel.cuh") << R"(#pragma once
#include "loom/lang/context.cuh"
template <int N>
__global__ void consumer_kernel(loom::Ctx ctx, int* out) { out[threadIdx.x] = N + ctx.rank; }
)";
    loom::jit::KernelSpec spec;
    spec.header = (dir / "consumer_kernel.cuh").string();
    spec.name = "consumer_kernel";
    spec.template_args = {"3"};
    auto r = loom::jit::compile(spec, 90);
    loom::jit::KernelSpec header_only{.header = "loom/lang/context.cuh"};
    auto h = loom::jit::compile(header_only, 80);
    std::printf(
        "loom consumer: rank %d of %d (%s); compiled %s for sm_90a (%zu-byte cubin, %s, %d registers, %s); "
        "%s alone for sm_80\n",
        info.rank, info.world_size, info.source.c_str(), spec.display().c_str(), r.cubin.size(), r.compiler.c_str(),
        r.registers, r.lowered_name.c_str(), header_only.header.c_str());
    return r.cubin.empty() || h.cubin.empty() ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "loom consumer: %s\n", e.what());
    return 1;
}
