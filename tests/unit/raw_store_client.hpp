// Talking to the bootstrap store's server byte by byte, as a stranger or a misbehaving rank would: the store tests
// and the store fuzzer build frames with the server's own codec and watch what comes back.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "runtime/socket_util.hpp"
#include "runtime/store_auth.hpp"
#include "runtime/store_server.hpp"

namespace loom::test {

using Op = store_wire::Op;
using Status = store_wire::Status;

// A blocking TCP connection to 127.0.0.1:port; -1 when refused.
inline int raw_connect(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
        ::close(fd);
        return -1;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

// [u32 length][body]
inline std::string framed(std::string_view body) { return net::Writer().u32(body.size()).data() + std::string(body); }

// A request body: [u8 op][u32 timeout ms][fields].
inline std::string body(Op op, const net::Writer& fields, std::uint32_t timeout_ms = 2000) {
    return net::Writer().u8(static_cast<std::uint8_t>(op)).u32(timeout_ms).data() + fields.data();
}

inline std::string hello_frame(std::string_view token, int rank, int world) {
    return framed(body(Op::Hello, net::Writer().bytes(token).i32(rank).i32(world)));
}

inline std::string hello_frame(const store_auth::Token& token, int rank, int world) {
    return hello_frame(std::string_view(reinterpret_cast<const char*>(token.data()), token.size()), rank, world);
}

// Sends what the socket takes within `limit`; false when the peer is gone or the time is up.
inline bool send_bytes(int fd, std::string_view data, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    std::string why;
    return net::send_all(fd, data.data(), data.size(), net::Clock::now() + limit, &why);
}

// What the peer sent until it closed the connection or `limit` passed.
struct Received {
    std::string bytes;
    bool closed = false;
};

inline Received read_until_close(int fd, std::chrono::milliseconds limit) {
    Received r;
    const auto deadline = net::Clock::now() + limit;
    char buf[65536];
    while (true) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, net::ms_left(deadline)) <= 0) return r;
        ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
            r.closed = true;
            return r;
        }
        r.bytes.append(buf, static_cast<std::size_t>(n));
    }
}

// One reply: its status and the payload after it; nullopt when the connection closed or nothing came in `limit`.
struct Reply {
    Status status;
    std::string payload;
    std::string text() const { return std::string(net::Reader(payload).bytes()); }  // an error's message
};

inline std::optional<Reply> read_reply(int fd, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto deadline = net::Clock::now() + limit;
    std::string why;
    char hdr[4];
    if (!net::recv_all(fd, hdr, 4, deadline, &why)) return std::nullopt;
    std::string data(net::Reader(std::string_view(hdr, 4)).u32(), '\0');
    if (data.empty() || !net::recv_all(fd, data.data(), data.size(), deadline, &why)) return std::nullopt;
    return Reply{static_cast<Status>(static_cast<std::uint8_t>(data[0])), data.substr(1)};
}

// n bytes from rng: the fuzzers' frames and keys.
inline std::string random_bytes(std::size_t n, std::mt19937_64& rng) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
}

}  // namespace loom::test
