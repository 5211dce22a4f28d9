// The intra-kernel profiler's record layout and tags, shared by the device writer (lang/profile.cuh) and the host
// reader (src/runtime/profile*.cpp). Compiles under the host compiler, nvcc and NVRTC.
//
// Layout of a rank's ring (device memory, one per process and device, src/runtime/profile_ring.cpp):
//   ProfileRing header (32 bytes), then `capacity` ProfileEvent records (32 bytes each).
// A writer claims record i with one atomicAdd on `count` (relaxed, gpu scope) and writes it only when i < capacity;
// `count` keeps counting past the capacity, so the host knows how many records were dropped.
#pragma once

#include "loom/config.hpp"

namespace loom::lang {

// What a record marks. A Begin and the next End of the same tag on the same (SM, block, warp) make one span.
enum ProfileKind : uint8_t { kProfileBegin = 0, kProfileEnd = 1, kProfileInstant = 2 };

// Tags of Loom's instrumented kernels; the host names them (src/runtime/profile_trace.cpp tag_name). User kernels
// take tags from kProfileUserTag0 on and name them with loom::profile::register_tag.
enum ProfileTag : uint16_t {
    kTagGemmTile = 1,     // consumer warpgroup: one tile's (or split unit's) mainloop; value (m_block << 16) | n_block
    kTagAgChunkWait = 2,  // ag_gemm GEMM producer thread: waiting for rank `value`'s chunk before a tile's loads
    kTagAgPush = 3,       // ag_gemm SM producer block: its share of the chunk to rank `value` (wait ready + put)
    kTagAgStage = 4,      // ag_gemm direct producer block: staging its share of the shard
    kTagRsPushTile = 5,   // gemm_rs fused epilogue warpgroup: storing a peer's tile `value` into its scratch
    kTagRsRingWait = 6,   // gemm_rs fused epilogue producer thread: waiting for peers' copies of own tile `value`
    kTagRsScatterWait = 7,    // gemm_rs scatter-reduce warp: waiting for the GEMM's tile `value`
    kTagRsScatterPush = 8,    // gemm_rs scatter-reduce warp: pushing tile `value`'s rows to their owners
    kTagRsScatterReduce = 9,  // gemm_rs scatter-reduce warp: summing the copies of own tile `value`
    kTagArPushTile = 10,      // gemm_ar fused epilogue warpgroup: pushing part `value` of a tile to every peer
    kTagArPeerWait = 11,      // gemm_ar fused epilogue warpgroup: waiting for the peers' copies of part `value`
    kTagArReduceTile = 12,    // gemm_ar reduce kernel block: waiting for and summing tile `value`
    kTagCollKernel = 13,      // collective kernel block: the whole kernel; value: the kernel's ProfileColl id
    kTagCollBarrier = 14,     // collective kernel block: a barrier with the peers (barrier_peers); value: phase
    kTagEpLlPhase = 15,       // ep_ll kernel block: one phase; value: EpLlPhase
    kTagEpKernel = 16,        // ep_dispatch / ep_combine kernel block: the whole kernel; value: EpKernel
    kProfileUserTag0 = 1024,  // first tag of user kernels
};

// EpLlPhase: which phase of the low-latency EP kernels (kernels/moe/ep_ll.cuh) a kTagEpLlPhase span is.
enum EpLlPhase : uint32_t { kEpLlDispatchSend = 0, kEpLlDispatchRecv = 1, kEpLlCombineSend = 2, kEpLlCombineRecv = 3 };

// EpKernel: which kernel of the throughput-mode EP ops (kernels/moe/ep_dispatch.cuh, ep_combine.cuh) a kTagEpKernel
// span is.
enum EpKernel : uint32_t {
    kEpLayoutCount = 0,
    kEpLayoutScan = 1,
    kEpLayoutIndex = 2,
    kEpDispatchPush = 3,
    kEpDispatchArrive = 4,
    kEpCombineSend = 5,
    kEpCombineReduce = 6
};

// ProfileColl: which collective kernel a kTagCollKernel span belongs to (its value).
enum ProfileColl : uint32_t {
    kCollAllGather = 1,
    kCollAllReduce = 2,
    kCollReduceScatter = 3,
    kCollAllToAll = 4,
    kCollLowLatency = 5,  // the LL (packet) kernels of every collective
};

struct alignas(16) ProfileEvent {
    uint64_t t_ns;   // %globaltimer at the record
    uint32_t value;  // the tag's argument (tile, rank, phase)
    uint16_t tag;    // ProfileTag
    uint8_t kind;    // ProfileKind
    uint8_t warp;    // linear warp index inside the block
    uint32_t sm;     // %smid
    uint32_t block;  // linear block index
    uint64_t reserved;
};
static_assert(sizeof(ProfileEvent) == 32, "ProfileEvent is 32 bytes (two 16-byte stores)");

struct alignas(16) ProfileRing {
    unsigned long long count;  // records claimed so far (may exceed capacity: the excess was dropped)
    uint32_t capacity;         // records that fit after the header
    uint32_t reserved0;
    uint64_t reserved1[2];
    // ProfileEvent events[capacity] follow.
};
static_assert(sizeof(ProfileRing) == 32, "ProfileRing's header is 32 bytes");

}  // namespace loom::lang
