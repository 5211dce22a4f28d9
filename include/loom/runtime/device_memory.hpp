// The buffers an op is given: how Loom checks them, and what it asks of the caller.
//
// Before launching anything, every op (loom::gemm, the collectives, the overlapped GEMMs) checks each buffer it is
// given: not null, aligned, its size free of overflow, and its whole extent memory the op's GPU can use —
//   - in the World's symmetric heap: inside one live allocation of world.alloc (a short one is refused, naming the
//     bytes needed and the allocation's);
//   - elsewhere: device memory of the op's GPU (cudaMalloc, cudaMallocAsync, cuMemMap, a framework's GPU tensor) or
//     managed memory, at its first and its last byte. Host memory (malloc, a static array, cudaMallocHost) and another
//     GPU's memory are refused.
// The driver is asked once per allocation (cuPointerGetAttributes) and its answer cached by address range, so a
// repeated call costs a lookup (a repeated collective replays its checked launch: after any free Loom knows of, it is
// checked again). Loom drops the ranges of memory it frees itself. Memory the caller frees stays cached:
// after freeing memory that was given to an op (cudaFree, cuMemUnmap, a framework's allocator releasing a segment),
// call forget_device_memory before that address range can return as an allocation of another size or kind, or the
// check may pass a buffer it should refuse (it never refuses a good one).
#pragma once

namespace loom {

// Drops what Loom cached about the allocation holding `p`; nullptr: about every allocation. Thread-safe.
void forget_device_memory(const void* p = nullptr);

}  // namespace loom
