// Collectives on the node's symmetric heap: AllGather, ReduceScatter, AllReduce, AllToAll (equal and variable
// splits). See docs/collectives.md for the algorithms, data paths and the automatic choice.
//
// Contract (every function): collective over the World — every rank calls it in the same order with the same
// options and the same count (all_to_all_v: the same out.count). Work is enqueued on `stream`; the call returns
// without waiting for the GPU and never synchronises the host, so back-to-back calls and CUDA-graph capture
// work (the per-call epoch lives in device memory). Buffers are device memory of this rank; algorithms that
// read or write a peer's buffer need it in the symmetric heap (allocate it with world.alloc): the error says
// which buffer. Every buffer is checked before anything is launched (loom/runtime/device_memory.hpp): a host pointer,
// or a symmetric buffer shorter than its count, raises loom::Error naming it. In-place: all_gather with in == out +
// rank * in.count, reduce_scatter with out == in + rank * out.count, all_reduce with out == in. At most 8 ranks per
// node. In a World of several nodes all_gather, reduce_scatter, all_reduce, all_to_all and all_to_all_v run their
// hierarchical forms (node peers by load/store, other nodes through NVSHMEM; docs/collectives.md, "Across nodes"):
// they need their buffers symmetric (all_gather: out; reduce_scatter: in; all_reduce, all_to_all, all_to_all_v: both;
// all_to_all_v's counts and offsets may be any device memory) and take only CollAlgo::Auto; barrier_on_stream runs
// within one node only and raises there.
//
// State: each algorithm keeps its own state in the World (signals, scratch, side streams), created by its first
// call — which synchronises the device and meets the peers, so it must not be a call captured in a CUDA graph
// (the error says so): make one eager call of every captured sequence first, as a warm-up does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

enum class CollKind { AllGather, ReduceScatter, AllReduce, AllToAll, AllToAllV };
enum class CollAlgo { Auto, Push, Pull, Ring, Scatter, OneShot, TwoShot, LL };
enum class DataPath { Auto, LdSt, Tma, CopyEngine };
enum class ReduceOp { Sum, Max };

struct CollOptions {
    CollAlgo algo = CollAlgo::Auto;
    DataPath path = DataPath::Auto;
    ReduceOp op = ReduceOp::Sum;  // reduce_scatter / all_reduce
    int num_sms = 0;              // block budget (one block per SM); 0: the algorithm's default
};

const char* to_string(CollKind k);
const char* to_string(CollAlgo a);
const char* to_string(DataPath p);

// out (world * in.count elements) = every rank's in, in rank order. Push / Ring need out symmetric, Pull needs
// in symmetric. Data paths: LdSt, Tma (sm_90), CopyEngine (push / pull only).
void all_gather(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts = {});
// out (in.count / world elements) = op over ranks of chunk `rank` of in. Pull needs in symmetric; Scatter
// stages through the collective scratch (any in). fp32 accumulation for 16-bit types.
void reduce_scatter(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts = {});
// out = op over ranks of in (same count). LL and OneShot take any buffers; TwoShot needs in symmetric (an out
// outside the symmetric heap is staged through the collective scratch; its copy-engine path needs out symmetric).
void all_reduce(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts = {});
// Equal splits: in and out hold world blocks of in.count / world elements; block j of in goes to rank j, where
// it lands as block `rank`. Push needs out symmetric, Pull in symmetric (LL: any buffers); not in-place.
void all_to_all(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts = {});
// Variable splits with counts in device memory (MoE): send_counts (int64[world], symmetric) elements go to each
// rank, taken from in at send_offsets (int64[world], device; nullptr: packed prefix sums). Each rank's out
// (capacity out.count, the same on every rank; symmetric for Push — with out outside the symmetric heap, Pull reads
// the blocks from the senders: in symmetric, send_offsets nullptr or symmetric) receives the blocks packed in
// source-rank order; recv_counts (int64[world], device, may be nullptr) receives what each rank sent. Counts are
// read on the device: no host synchronisation. A block past the sender's in (send_offsets[j] + send_counts[j] >
// in.count) or past the receiver's out is reported and traps (with LOOM_CHECK_AGREEMENT=1: raises on every rank).
void all_to_all_v(World& world, BufferView in, BufferView out, const int64_t* send_counts, const int64_t* send_offsets,
                  int64_t* recv_counts, cudaStream_t stream, const CollOptions& opts = {});

// Stream-ordered barrier over the node's ranks (nvshmemx_barrier_all_on_stream): a one-block kernel on `stream`
// that no rank passes before every rank's stream has reached it. Also how benchmarks start every rank's timed
// region together (a host barrier leaves the ranks tens of microseconds apart). hold_us > 0: the kernel ends that
// long after the ranks met, so that the work each rank enqueues right after it is queued on every rank by then
// and starts together (without it, the last rank to arrive is still enqueueing its next launch when the others
// leave, and that host latency lands inside what follows).
void barrier_on_stream(World& world, cudaStream_t stream, double hold_us = 0);

// Frees the state the collectives keep in the World (World::release_states("collectives/"): signals, side streams,
// and the symmetric scratch and LL area where an algorithm used them; at most ~80 MiB per rank at the default
// WorldOptions::coll_scratch and 8 ranks). Collective: every rank calls it, with no collective of this World in flight.
// The next collective call creates what it needs again.
void release_collective_state(World& world);

}  // namespace loom
