// Private helpers for the bootstrap store: TCP sockets with deadlines and the little-endian wire codec.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::net {

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline` for poll(): >= 0, capped so that it fits an int.
int ms_left(Clock::time_point deadline);

// Binds (addr, port) without listening yet, so that a caller can prepare before the first connection arrives.
// addr is resolved as IPv4 on this host and exactly that address is bound: a loopback address accepts only local
// connections; every interface (0.0.0.0) only when addr says so. port 0 picks a free port. Returns the fd
// (non-blocking, close-on-exec) and the bound port. A busy port raises "addr:port is in use; set LOOM_MASTER_PORT
// ...", an address that is not this host's raises naming it.
int tcp_bind(const std::string& addr, int port, int* bound_port);
// listen() on a socket from tcp_bind; raises naming (addr, port) on failure.
void tcp_listen(int fd, const std::string& addr, int port);

// One connection attempt bounded by `deadline`; returns the fd (blocking, close-on-exec, TCP_NODELAY) or -1
// with `why` set (e.g. "Connection refused").
int tcp_connect(const std::string& addr, int port, Clock::time_point deadline, std::string* why);

// Whole-buffer I/O on a blocking socket, bounded by `deadline`. send_all: false on timeout or error (why set).
// recv_all: false on timeout, end of stream or error (why set: "timeout", "closed" or the errno text).
bool send_all(int fd, const void* data, std::size_t n, Clock::time_point deadline, std::string* why);
bool recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline, std::string* why);

// Append-only encoder of a frame body.
class Writer {
  public:
    Writer& u8(std::uint8_t v);
    Writer& u32(std::uint32_t v);
    Writer& i32(std::int32_t v) { return u32(static_cast<std::uint32_t>(v)); }
    Writer& i64(std::int64_t v);
    Writer& bytes(std::string_view v);  // u32 length + data
    const std::string& data() const { return buf_; }
    // [u32 length][body]
    std::string frame() const;

  private:
    std::string buf_;
};

// Bounds-checked decoder; every accessor raises loom::Error on a short or malformed body.
class Reader {
  public:
    explicit Reader(std::string_view data) : data_(data) {}
    std::uint8_t u8();
    std::uint32_t u32();
    std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
    std::int64_t i64();
    std::string_view bytes();
    bool done() const { return pos_ == data_.size(); }

  private:
    void need(std::size_t n);
    std::string_view data_;
    std::size_t pos_ = 0;
};

// Largest reply frame a client accepts (an all-gather's reply holds every rank's value). The server bounds requests
// far lower (store_server.hpp).
inline constexpr std::uint32_t kMaxFrame = 1u << 30;

}  // namespace loom::net
