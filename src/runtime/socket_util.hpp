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

// Listens on (addr, port); addr is resolved as IPv4 and a loopback address binds only loopback, any other
// address binds every interface (the name may resolve differently on other hosts). port 0 picks a free port.
// Returns the listening fd (non-blocking, close-on-exec) and the bound port. A busy port raises
// "addr:port is in use; set LOOM_MASTER_PORT to a free port ...".
int tcp_listen(const std::string& addr, int port, int* bound_port);

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

// Largest frame either side accepts: guards against a stray client sending garbage lengths.
inline constexpr std::uint32_t kMaxFrame = 1u << 30;

}  // namespace loom::net
