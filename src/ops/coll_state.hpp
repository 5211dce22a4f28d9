// Per-World state of the collectives: the symmetric synchronisation block, scratch and LL area, the topology
// facts the automatic choice needs, and the launch helpers shared by src/ops/{all_gather,reduce_scatter,
// all_reduce,all_to_all}.cpp.
//
// Created on the first collective call on a World (collective: every rank makes the same first call) and kept
// until release_coll_state(world) or process exit. Thread-safe lookup; calls on one World must come from one
// thread at a time (as for every collective).
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "loom/kernels/coll_params.hpp"
#include "loom/ops/collectives.hpp"

namespace loom::coll {

struct CollState {
    kernels::coll::SyncState* sync = nullptr;  // symmetric, zeroed once
    char* scratch = nullptr;                   // symmetric
    std::size_t scratch_bytes = 0;             // LOOM_COLL_SCRATCH (default 64 MiB)
    char* ll = nullptr;                        // symmetric LL area
    std::size_t ll_bytes = 0;
    CollTopology topo;
    int num_sms = 0;  // SMs of the device
};

// The World's state, created (collectively) on first use. Raises for a world the collectives do not support.
CollState& coll_state(World& world);
// Frees the state's symmetric buffers (collective). Later calls create a fresh state.
void release_coll_state(World& world);

// Resolved launch: which kernel, grid, smem, and the kernel arguments.
struct Launch {
    std::string name;                        // "loom::kernels::coll::all_gather_push"
    std::string header;                      // "loom/kernels/all_gather.cuh"
    std::vector<std::string> template_args;  // {"__nv_bfloat16", "1"}
    int blocks = 1;
    int threads = 512;
    std::size_t smem = 0;
    kernels::coll::Params params{};
};
void launch(World& world, const Launch& l, cudaStream_t stream);
// The one-block peer barrier (copy-engine path).
void launch_barrier(World& world, CollState& st, cudaStream_t stream);

// Params with the state's pointers filled in.
kernels::coll::Params base_params(const CollState& st);
// TMA staging of a launch: sets p.stages / p.stage_bytes and returns the dynamic smem bytes.
std::size_t tma_staging(kernels::coll::Params& p);
// Blocks for `work_bytes` of traffic per block-share: at least 1, at most `cap` and the num_sms budget.
int pick_blocks(std::size_t work_bytes, std::size_t bytes_per_block, int cap, const CollOptions& opts,
                const CollState& st);

// The LL kernels of kernels/coll_ll.cuh: sets l.header, l.name ("loom::kernels::coll::<op>_ll"), grid, threads
// and packets per block for chunks of `chunk_bytes` (see Params::count). Raises when a chunk is over the LL
// area's capacity (ll_capacity_bytes()), naming the algorithms that fit.
void setup_ll(Launch& l, const char* op, std::size_t chunk_bytes, const CollOptions& opts, const CollState& st);
constexpr std::size_t ll_capacity_bytes() {
    return std::size_t(kernels::coll::kMaxLLBlocks) * kernels::coll::kLLPacketsPerBlock * 8;
}

// ---- validation shared by the ops ------------------------------------------------------------------------------
void check_buffer(const char* op, const char* which, const BufferView& b);
void check_same_dtype(const char* op, const BufferView& in, const BufferView& out);
void check_float_dtype(const char* op, const BufferView& b);
// Raises "<op>: <which> (<ptr>, <bytes> bytes) is not in the symmetric heap; the <algo> algorithm needs it
// there: allocate it with world.alloc".
void check_symmetric(const char* op, const char* algo, const char* which, World& world, const BufferView& b);
bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn);
const char* cuda_type(DType t);  // "float", "__half", "__nv_bfloat16"
int path_arg(DataPath p);        // kPathLdSt / kPathTma
// Resolves Auto in opts from the choice; checks the algorithm / path pair is offered for the op.
CollChoice resolve(CollKind kind, std::size_t bytes, World& world, CollState& st, const CollOptions& opts,
                   bool in_symmetric, bool out_symmetric);

}  // namespace loom::coll
