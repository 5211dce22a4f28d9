// Private: the bootstrap store's server, hosted by rank 0's Store in a background thread.
//
// One poll() loop serves every client (non-blocking sockets, per-connection buffers), so a slow or dead
// client never stalls the others. Requests that wait (get, wait, barrier/all-gather arrivals) are parked
// and answered when their keys appear or all ranks arrive, or with an error naming what is missing when
// the timeout carried by the request expires.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

namespace loom::store_wire {

enum class Op : std::uint8_t { Hello = 1, Set, Get, Check, Wait, Add, Gather };
enum class Status : std::uint8_t { Ok = 0, Error = 1 };

}  // namespace loom::store_wire

namespace loom {

class StoreServer {
  public:
    // Binds (addr, port) now, so a busy port raises in the constructor; then serves in a thread.
    StoreServer(const std::string& addr, int port, int world_size);
    ~StoreServer();  // stop(0)
    StoreServer(const StoreServer&) = delete;
    StoreServer& operator=(const StoreServer&) = delete;

    int port() const { return port_; }

    // Stops serving once every client has disconnected or `drain` has passed, whichever is first, so that
    // ranks still finishing their last requests are not cut off by rank 0 leaving early. Idempotent.
    void stop(std::chrono::milliseconds drain);

  private:
    void serve();

    int world_size_;
    int listen_fd_ = -1;
    int port_ = 0;
    int wake_[2] = {-1, -1};  // self-pipe: stop() wakes poll()
    std::atomic<bool> stopping_{false};
    std::atomic<std::int64_t> drain_until_ns_{0};
    std::thread thread_;
};

}  // namespace loom
