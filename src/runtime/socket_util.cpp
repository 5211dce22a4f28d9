#include "socket_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "loom/runtime/error.hpp"

namespace loom::net {

int ms_left(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left < 0) return 0;
    return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

namespace {

// Waits until `fd` is ready for `events` (EINTR retried); false with `why` set on timeout or error.
bool wait_ready(int fd, short events, Clock::time_point deadline, std::string* why) {
    for (;;) {
        pollfd pfd{fd, events, 0};
        const int rc = ::poll(&pfd, 1, ms_left(deadline));
        if (rc > 0) return true;
        if (rc == 0) {
            *why = "timeout";
            return false;
        }
        if (errno != EINTR) {
            *why = std::strerror(errno);
            return false;
        }
    }
}

// IPv4 address of `addr` (a dotted quad or a host name).
bool resolve(const std::string& addr, int port, sockaddr_in* out, std::string* why) {
    std::memset(out, 0, sizeof(*out));
    out->sin_family = AF_INET;
    out->sin_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET, addr.c_str(), &out->sin_addr) == 1) return true;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(addr.c_str(), nullptr, &hints, &res);
    if (rc != 0 || !res) {
        *why = fmt::format("cannot resolve \"{}\": {}", addr, gai_strerror(rc));
        return false;
    }
    out->sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return true;
}

}  // namespace

int tcp_bind(const std::string& addr, int port, int* bound_port) {
    LOOM_CHECK(port >= 0 && port <= 65535, "store port: expected a TCP port in [0, 65535], given {}", port);
    sockaddr_in sa{};
    std::string why;
    LOOM_CHECK(resolve(addr, port, &sa, &why), "store address (LOOM_MASTER_ADDR): {}", why);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    LOOM_CHECK_ERRNO(fd);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // restart quickly after TIME_WAIT
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
        int err = errno;
        ::close(fd);
        LOOM_CHECK(err != EADDRINUSE,
                   "{}:{} is in use; set LOOM_MASTER_PORT to a free port (Loom's store port; without it the store "
                   "takes MASTER_PORT + 1, else 29500)",
                   addr, port);
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
        LOOM_CHECK(err != EADDRNOTAVAIL,
                   "cannot bind the store to {} ({}): not an address of this host; rank 0 binds LOOM_MASTER_ADDR "
                   "(or MASTER_ADDR) as given, so set it to one of this host's addresses, or to 0.0.0.0 on rank 0 "
                   "to listen on every interface",
                   addr, ip);
        LOOM_FAIL("cannot bind the store to {}:{}: {}", addr, port, std::strerror(err));
    }
    socklen_t len = sizeof(sa);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    *bound_port = ntohs(sa.sin_port);
    return fd;
}

void tcp_listen(int fd, const std::string& addr, int port) {
    if (::listen(fd, 1024) != 0) LOOM_FAIL("cannot listen on {}:{}: {}", addr, port, std::strerror(errno));
}

int tcp_connect(const std::string& addr, int port, Clock::time_point deadline, std::string* why) {
    sockaddr_in sa{};
    if (!resolve(addr, port, &sa, why)) return -1;
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *why = std::strerror(errno);
        return -1;
    }
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        rc = ::poll(&p, 1, ms_left(deadline));
        if (rc == 1) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            errno = err;
            rc = err == 0 ? 0 : -1;
        } else {
            errno = rc == 0 ? ETIMEDOUT : errno;
            rc = -1;
        }
    }
    if (rc != 0) {
        *why = std::strerror(errno);
        ::close(fd);
        return -1;
    }
    int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

bool send_all(int fd, const void* data, std::size_t n, Clock::time_point deadline, std::string* why) {
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
        if (!wait_ready(fd, POLLOUT, deadline, why)) return false;
        ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            *why = errno == EPIPE || errno == ECONNRESET ? "closed" : std::strerror(errno);
            return false;
        }
        p += w;
        n -= static_cast<std::size_t>(w);
    }
    return true;
}

bool recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline, std::string* why) {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
        if (!wait_ready(fd, POLLIN, deadline, why)) return false;
        ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
        if (r == 0) {
            *why = "closed";
            return false;
        }
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            *why = errno == ECONNRESET ? "closed" : std::strerror(errno);
            return false;
        }
        p += r;
        n -= static_cast<std::size_t>(r);
    }
    return true;
}

Writer& Writer::u8(std::uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
}

Writer& Writer::u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
}

Writer& Writer::i64(std::int64_t v) {
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    return *this;
}

Writer& Writer::bytes(std::string_view v) {
    LOOM_CHECK(v.size() < kMaxFrame, "store value too large: expected < {} bytes, given {}", kMaxFrame, v.size());
    u32(static_cast<std::uint32_t>(v.size()));
    buf_.append(v.data(), v.size());
    return *this;
}

std::string Writer::frame() const {
    LOOM_CHECK(buf_.size() <= kMaxFrame, "store message too large: expected <= {} bytes, given {}", kMaxFrame,
               buf_.size());
    Writer w;
    w.u32(static_cast<std::uint32_t>(buf_.size()));
    return w.buf_ + buf_;
}

void Reader::need(std::size_t n) {
    LOOM_CHECK(data_.size() - pos_ >= n, "malformed store message: expected {} more bytes, {} left", n,
               data_.size() - pos_);
}

std::uint8_t Reader::u8() {
    need(1);
    return static_cast<std::uint8_t>(data_[pos_++]);
}

std::uint32_t Reader::u32() {
    need(4);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<std::uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return v;
}

std::int64_t Reader::i64() {
    need(8);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<std::uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return static_cast<std::int64_t>(v);
}

std::string_view Reader::bytes() {
    std::uint32_t n = u32();
    need(n);
    auto v = data_.substr(pos_, n);
    pos_ += n;
    return v;
}

}  // namespace loom::net
