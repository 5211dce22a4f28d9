#include "ops/collectives/copy_engine.hpp"

#include "loom/runtime/error.hpp"

namespace loom::coll {

CopyEngine::~CopyEngine() {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    for (cudaEvent_t e : done_) cudaEventDestroy(e);
    if (fork_) cudaEventDestroy(fork_);
}

cudaStream_t CopyEngine::stream(std::size_t i) {
    while (streams_.size() <= i) {
        cudaStream_t s = nullptr;
        cudaEvent_t e = nullptr;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        streams_.push_back(s);
        done_.push_back(e);
    }
    return streams_[i];
}

void CopyEngine::fork(cudaStream_t stream, std::size_t n) {
    if (!fork_) LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    LOOM_CHECK_CUDA(cudaEventRecord(fork_, stream));
    for (std::size_t i = 0; i < n; ++i) LOOM_CHECK_CUDA(cudaStreamWaitEvent(this->stream(i), fork_, 0));
}

void CopyEngine::join(cudaStream_t stream, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        cudaStream_t side = this->stream(i);
        LOOM_CHECK_CUDA(cudaEventRecord(done_[i], side));
        LOOM_CHECK_CUDA(cudaStreamWaitEvent(stream, done_[i], 0));
    }
}

void CopyEngine::fanout(cudaStream_t stream, const std::vector<Copy>& copies) {
    fork(stream, copies.size());
    for (std::size_t i = 0; i < copies.size(); ++i)
        LOOM_CHECK_CUDA(
            cudaMemcpyAsync(copies[i].dst, copies[i].src, copies[i].bytes, cudaMemcpyDefault, this->stream(i)));
    join(stream, copies.size());
}

}  // namespace loom::coll
