// Passing file descriptors between processes of one host: abstract Unix-domain sockets with SCM_RIGHTS.
//
// The symmetric heap uses it to hand each cuMemCreate allocation's POSIX file descriptor to the other ranks
// of the node. Every wait here is bounded by a deadline and raises loom::Error naming what never arrived.
// Abstract socket names live in the network namespace (no file to clean up); the caller makes them unique
// per job (the heap uses a nonce published by rank 0 through the store, which only the job's ranks can read).
// Both ends check the other's credentials (SO_PEERCRED): a listener drops connections of other users, and a sender
// raises rather than hand a descriptor to a listener of another user (one that bound the name first).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::detail {

using Deadline = std::chrono::steady_clock::time_point;

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
  public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    ~UniqueFd() { reset(); }
    UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
    UniqueFd& operator=(UniqueFd&& o) noexcept {
        if (this != &o) reset(o.release());
        return *this;
    }
    UniqueFd(const UniqueFd&) = delete;
    UniqueFd& operator=(const UniqueFd&) = delete;

    int get() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
    int release() {
        int fd = fd_;
        fd_ = -1;
        return fd;
    }
    void reset(int fd = -1);

  private:
    int fd_ = -1;
};

// One descriptor received with the sender's 64-bit tag (the heap sends its local rank).
struct ReceivedFd {
    UniqueFd fd;
    std::uint64_t tag = 0;
};

// A listening abstract socket. Created before any peer may connect (the caller orders that, e.g. with a store
// barrier); connections made while it is not yet listening are retried by send_fd until its deadline.
class FdListener {
  public:
    explicit FdListener(const std::string& name);  // name without the leading NUL; at most 100 bytes
    const std::string& name() const { return name_; }
    // Accepts one connection and receives one descriptor from it. Raises on the deadline.
    ReceivedFd receive(Deadline deadline);

  private:
    std::string name_;
    UniqueFd sock_;
};

// Connects to the listener `name` (retrying while it does not exist yet), sends `fd` with `tag`, and closes the
// connection. The descriptor in flight stays valid even when the sender exits before it is received.
void send_fd(const std::string& name, int fd, std::uint64_t tag, Deadline deadline);

// All-to-all exchange among `n` processes of one host, each holding one descriptor: process `me` listens on
// `prefix + "-" + me`, calls `listening()` (a barrier, so no process connects before every listener exists),
// sends `my_fd` to every other process and receives theirs. Returns the received descriptors indexed by the
// sender (entry `me` is empty). Raises naming the processes whose descriptor never arrived by the timeout.
std::vector<UniqueFd> exchange_fds(const std::string& prefix, int me, int n, int my_fd,
                                   const std::function<void()>& listening, std::chrono::milliseconds timeout);

}  // namespace loom::detail
