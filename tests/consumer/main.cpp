// Uses the installed package: parses rank facts and compiles a kernel header from the installed tree.
#include <cstdio>

#include "loom/jit/jit.hpp"
#include "loom/runtime/env.hpp"

int main() {
    loom::RankInfo info = loom::rank_info_from_env();
    loom::jit::KernelSpec spec{.header = "loom/lang/context.cuh", .name = "", .template_args = {}};
    std::printf("loom consumer: rank %d of %d (%s); jit header %s\n", info.rank, info.world_size, info.source.c_str(),
                spec.header.c_str());
    return 0;
}
