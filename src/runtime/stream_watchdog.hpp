// The host watchdog of copy-engine stream waits: the bound LOOM_WAIT_TIMEOUT_MS puts on device spin-waits, applied
// to cuStreamWaitValue64, which the GPU cannot bound.
//
// An op that enqueues stream waits (all_gather / reduce_scatter through the copy engine, ag_gemm, gemm_rs) declares
// a WatchedWaits for the call, enqueues its waits through it, and calls enqueued() after its last stream operation:
// that records one event on the caller's stream and hands the call (op, call number, each wait's address, value and
// peer) to the World's StreamWatchdog. Its thread (started on the first watched call, joined when the World goes)
// polls the events every 10-50 ms; a call still outstanding after the bound whose waits it finds unsatisfied (read
// twice, 10 ms apart, the call still not complete) is reported on stderr, one line:
//   loom: wait timeout: rank 0: all_gather call 2 (copy-engine stream wait) outstanding for 2013 ms; missing: the
//   signal of rank 1 at 0x7f00 (expected >= 2, observed 1); ending the process (...)
// and the process aborts (std::abort, SIGABRT): the host thread that would see an error is blocked on the stuck
// stream, so nothing can be raised to it. (A device wait that times out traps instead: the kernel ends with a sticky
// error that the next CUDA call raises as loom::Error. Either way the rank ends abnormally and loomrun stops the
// job.) A call whose waits are all satisfied is waiting on earlier work of its stream: its clock restarts.
//
// Cost on the hot path: one cudaEventRecord per call and one short lock; nothing with LOOM_WAIT_TIMEOUT_MS = 0 or
// while the stream is capturing a CUDA graph (a captured call's replays are not watched).
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/runtime/stream_ops.hpp"
#include "loom/runtime/world_state.hpp"
#include "runtime/wait_ledger.hpp"

namespace loom::detail {

class StreamWatchdog final : public WorldState {
  public:
    static constexpr const char* kKey = "runtime/stream_watchdog";
    explicit StreamWatchdog(World& world);
    // Stops and joins the thread (the World synchronised the device first), destroys the events.
    ~StreamWatchdog() override;

    // An event for a call's completion (pooled; disable-timing). Any thread.
    cudaEvent_t event();
    // Hands over a call whose `done` event is recorded; starts the thread on first use. Any thread.
    void watch(PendingCall c);

  private:
    void run();
    bool sweep();  // one poll; whether calls completed
    bool confirm(const PendingCall& c, std::vector<std::uint64_t>& observed, bool& readable);
    bool read_signals(const PendingCall& c, std::vector<std::uint64_t>& observed);
    void recycle(PendingCall&& c);

    const int rank_;
    const int device_;
    WaitLedger ledger_;
    std::mutex mu_;  // guards the pool, the thread's start and stop_
    std::condition_variable wake_;
    std::vector<cudaEvent_t> free_events_;
    std::vector<cudaEvent_t> all_events_;
    std::thread thread_;
    bool stop_ = false;
    bool broken_ = false;                // the thread's: the context reported an error; nothing is watched any more
    cudaStream_t read_ = nullptr;        // the thread's: a non-blocking stream for reading signals
    std::uint64_t* read_buf_ = nullptr;  // the thread's: pinned, where the reads land
};

// One op call's stream waits, watched by the World's StreamWatchdog (inactive when LOOM_WAIT_TIMEOUT_MS is 0 or
// `stream` is capturing). Construct before the call's first wait; not thread-safe (one host thread enqueues a call).
class WatchedWaits {
  public:
    // `op`: a string literal naming the op; `call`: the op's call number on this rank; `stream`: the caller's
    // stream, whose later work follows every stream operation of the call.
    WatchedWaits(World& world, const char* op, std::uint64_t call, cudaStream_t stream);
    // Hands the call over if enqueued() was not called (an exception left it part-enqueued). Never throws.
    ~WatchedWaits();
    WatchedWaits(const WatchedWaits&) = delete;
    WatchedWaits& operator=(const WatchedWaits&) = delete;

    // stream_ops::wait_value on `s`, remembered with `peer`, the rank whose write satisfies it.
    void wait_value(cudaStream_t s, const std::uint64_t* addr, std::uint64_t value, int peer,
                    stream_ops::WaitCmp cmp = stream_ops::WaitCmp::GEQ);
    // After the call's last stream operation on `stream`: records the completion event there and hands the call to
    // the watchdog. Once.
    void enqueued();

  private:
    StreamWatchdog* dog_ = nullptr;  // null: not watched
    cudaStream_t stream_;
    PendingCall call_;
};

}  // namespace loom::detail
