// The identity of a stream for caches of per-stream state (workspaces a stream's launches use one after another).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/runtime/error.hpp"

namespace loom::detail {

// The stream's handle, except for the per-thread default stream (cudaStreamPerThread), whose one handle names another
// stream in every host thread: then that stream's id (cudaStreamGetId), tagged in the top bit, so that two threads'
// launches never share a workspace at once. The caches keep an entry per key until their owner goes: a program that
// launches from many short-lived threads' per-thread streams (or many streams) holds a workspace for each.
inline std::uint64_t stream_key(cudaStream_t stream) {
    if (stream != cudaStreamPerThread) return reinterpret_cast<std::uintptr_t>(stream);
    unsigned long long id = 0;
    LOOM_CHECK_CUDA(cudaStreamGetId(stream, &id));
    return static_cast<std::uint64_t>(id) | (std::uint64_t{1} << 63);
}

}  // namespace loom::detail
