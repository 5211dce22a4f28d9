#include "runtime/fd_passing.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

#include "loom/runtime/error.hpp"
#include "runtime/socket_util.hpp"

namespace loom::detail {
namespace {

constexpr std::uint64_t kMagic = 0x6c6f6f6d66647631ull;  // "loomfdv1": rejects strangers on the socket

struct Message {
    std::uint64_t magic;
    std::uint64_t tag;
};

// sockaddr for an abstract name: sun_path[0] = '\0', then the name (not NUL-terminated).
socklen_t abstract_address(const std::string& name, sockaddr_un& addr) {
    LOOM_CHECK(!name.empty() && name.size() < sizeof(addr.sun_path) - 1,
               "fd passing: expected a socket name of 1..{} bytes, given '{}' ({} bytes)", sizeof(addr.sun_path) - 2,
               name, name.size());
    std::memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// Waits for `events` on `fd` until the deadline; false on timeout.
bool wait_for(int fd, short events, Deadline deadline) {
    for (;;) {
        pollfd p{fd, events, 0};
        int r = ::poll(&p, 1, net::ms_left(deadline));
        if (r > 0) return true;
        if (r == 0) return false;
        if (errno != EINTR) LOOM_CHECK_ERRNO(r);
    }
}

}  // namespace

void UniqueFd::reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
}

FdListener::FdListener(const std::string& name) : name_(name) {
    sockaddr_un addr;
    socklen_t len = abstract_address(name, addr);
    sock_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    LOOM_CHECK_ERRNO(sock_.get());
    if (::bind(sock_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
        int err = errno;
        LOOM_CHECK(err != EADDRINUSE,
                   "fd passing: abstract socket '{}' is already in use (another job with the same name on this host?)",
                   name);
        detail::throw_errno(err, "bind", __FILE__, __LINE__);
    }
    LOOM_CHECK_ERRNO(::listen(sock_.get(), 64));
}

ReceivedFd FdListener::receive(Deadline deadline) {
    for (;;) {
        LOOM_CHECK(wait_for(sock_.get(), POLLIN, deadline), "fd passing: no connection on '{}' before the deadline",
                   name_);
        UniqueFd conn(::accept4(sock_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!conn) {
            if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
            LOOM_CHECK_ERRNO(-1);
        }
        ucred cred{};
        socklen_t cred_len = sizeof cred;
        LOOM_CHECK_ERRNO(::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len));
        if (cred.uid != ::getuid()) continue;  // not ours: drop it and keep waiting

        Message msg{};
        iovec iov{&msg, sizeof msg};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
        msghdr hdr{};
        hdr.msg_iov = &iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control;
        hdr.msg_controllen = sizeof control;
        ssize_t got = -1;
        for (;;) {
            LOOM_CHECK(wait_for(conn.get(), POLLIN, deadline),
                       "fd passing: a peer connected to '{}' but sent nothing before the deadline", name_);
            got = ::recvmsg(conn.get(), &hdr, MSG_CMSG_CLOEXEC);
            if (got >= 0 || (errno != EAGAIN && errno != EINTR)) break;
        }
        LOOM_CHECK_ERRNO(got);
        UniqueFd received;
        for (cmsghdr* c = CMSG_FIRSTHDR(&hdr); c != nullptr; c = CMSG_NXTHDR(&hdr, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int))) {
                int fd;
                std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
                received.reset(fd);
            }
        }
        LOOM_CHECK(!(hdr.msg_flags & MSG_CTRUNC), "fd passing: control message truncated on '{}'", name_);
        if (got != static_cast<ssize_t>(sizeof msg) || msg.magic != kMagic || !received) continue;  // stranger
        return ReceivedFd{std::move(received), msg.tag};
    }
}

void send_fd(const std::string& name, int fd, std::uint64_t tag, Deadline deadline) {
    sockaddr_un addr;
    socklen_t len = abstract_address(name, addr);
    UniqueFd sock;
    // The listener may not exist yet (ECONNREFUSED) or its backlog may be full (EAGAIN): retry until the deadline.
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
        sock.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        LOOM_CHECK_ERRNO(sock.get());
        if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) break;
        int err = errno;
        if (err != ECONNREFUSED && err != EAGAIN && err != ENOENT && err != EINTR)
            detail::throw_errno(err, "connect", __FILE__, __LINE__);
        LOOM_CHECK(std::chrono::steady_clock::now() < deadline,
                   "fd passing: could not connect to '{}' before the deadline (is the peer listening?)", name);
        std::this_thread::sleep_for(pause);
    }
    // Abstract names can be bound by any process of the network namespace: hand the descriptor (the rank's GPU
    // memory) only to a listener of this user.
    ucred cred{};
    socklen_t cred_len = sizeof cred;
    LOOM_CHECK_ERRNO(::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len));
    LOOM_CHECK(cred.uid == ::getuid(),
               "fd passing: the listener on '{}' belongs to uid {} (pid {}), not to this user (uid {}); refusing to "
               "send it a descriptor",
               name, cred.uid, cred.pid, ::getuid());
    Message msg{kMagic, tag};
    iovec iov{&msg, sizeof msg};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    std::memset(control, 0, sizeof control);
    msghdr hdr{};
    hdr.msg_iov = &iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control;
    hdr.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&hdr);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    for (;;) {
        ssize_t sent = ::sendmsg(sock.get(), &hdr, MSG_NOSIGNAL);
        if (sent == static_cast<ssize_t>(sizeof msg)) return;
        if (sent >= 0) LOOM_FAIL("fd passing: short send to '{}' ({} of {} bytes)", name, sent, sizeof msg);
        if (errno != EAGAIN && errno != EINTR) detail::throw_errno(errno, "sendmsg", __FILE__, __LINE__);
        LOOM_CHECK(wait_for(sock.get(), POLLOUT, deadline), "fd passing: '{}' did not accept data before the deadline",
                   name);
    }
}

std::vector<UniqueFd> exchange_fds(const std::string& prefix, int me, int n, int my_fd,
                                   const std::function<void()>& listening, std::chrono::milliseconds timeout) {
    LOOM_CHECK(n >= 1 && me >= 0 && me < n, "fd exchange: expected 0 <= me < n, given me={} n={}", me, n);
    std::vector<UniqueFd> fds(n);
    FdListener listener(prefix + "-" + std::to_string(me));
    if (listening) listening();
    const Deadline deadline = std::chrono::steady_clock::now() + timeout;
    // Sends never block on a peer's receive (the message sits in the socket buffer), so every process can send
    // everything first and then receive without a deadlock.
    for (int peer = 0; peer < n; ++peer)
        if (peer != me) send_fd(prefix + "-" + std::to_string(peer), my_fd, static_cast<std::uint64_t>(me), deadline);
    for (int received = 0; received < n - 1;) {
        ReceivedFd r;
        try {
            r = listener.receive(deadline);
        } catch (const Error&) {
            std::string missing;
            for (int p = 0; p < n; ++p)
                if (p != me && !fds[p]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
            LOOM_FAIL("fd exchange '{}': process {} got no descriptor from process(es) {} within {} ms", prefix, me,
                      missing, timeout.count());
        }
        LOOM_CHECK(r.tag < static_cast<std::uint64_t>(n) && r.tag != static_cast<std::uint64_t>(me),
                   "fd exchange '{}': expected a sender in [0, {}) other than {}, given {}", prefix, n, me, r.tag);
        LOOM_CHECK(!fds[r.tag], "fd exchange '{}': process {} sent twice", prefix, r.tag);
        fds[r.tag] = std::move(r.fd);
        ++received;
    }
    return fds;
}

}  // namespace loom::detail
