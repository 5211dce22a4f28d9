#include "store_server.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "loom/runtime/error.hpp"
#include "socket_util.hpp"

namespace loom {
namespace {

using net::Clock;
using store_wire::Op;
using store_wire::Status;

std::string rank_list(const std::vector<int>& ranks) { return fmt::format("[{}]", fmt::join(ranks, ", ")); }

std::optional<std::int64_t> parse_i64(const std::string& s) {
    if (s.empty()) return std::nullopt;
    std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (i == s.size()) return std::nullopt;
    for (std::size_t j = i; j < s.size(); ++j)
        if (s[j] < '0' || s[j] > '9') return std::nullopt;
    errno = 0;
    long long v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == ERANGE) return std::nullopt;
    return v;
}

// The loop's state; lives on the server thread only, so it needs no lock.
class Loop {
  public:
    Loop(int listen_fd, int wake_fd, int world_size) : listen_fd_(listen_fd), wake_fd_(wake_fd), world_(world_size) {}

    ~Loop() {
        for (auto& [id, c] : conns_) ::close(c.fd);
    }

    // Runs until `should_stop(no_clients)` says so.
    template <class StopFn>
    void run(StopFn should_stop) {
        std::vector<pollfd> fds;
        std::vector<std::uint64_t> ids;
        while (!should_stop(conns_.empty())) {
            fds.clear();
            ids.clear();
            fds.push_back({wake_fd_, POLLIN, 0});
            fds.push_back({listen_fd_, POLLIN, 0});
            for (auto& [id, c] : conns_) {
                fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
                ids.push_back(id);
            }
            int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms());
            if (rc < 0 && errno != EINTR) {
                std::fprintf(stderr, "loom store server: poll failed: %s\n", std::strerror(errno));
                return;
            }
            if (rc > 0) {
                if (fds[0].revents & POLLIN) {
                    char buf[64];
                    while (::read(wake_fd_, buf, sizeof(buf)) > 0) {
                    }
                }
                if (fds[1].revents & POLLIN) accept_all();
                for (std::size_t i = 2; i < fds.size(); ++i) {
                    if (!fds[i].revents) continue;
                    std::uint64_t id = ids[i - 2];
                    if (!conns_.count(id)) continue;
                    if (fds[i].revents & POLLOUT) flush(id);
                    if (conns_.count(id) && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) read_from(id);
                }
            }
            expire(Clock::now());
        }
    }

  private:
    struct Conn {
        int fd;
        int rank = -1;
        std::string in, out;
    };
    struct KeyWaiter {
        std::uint64_t conn;
        Op op;
        std::vector<std::string> keys;
        Clock::time_point deadline;
        std::uint32_t timeout_ms;
    };
    struct GatherWaiter {
        std::uint64_t conn;
        int rank;
        Clock::time_point deadline;
        std::uint32_t timeout_ms;
    };
    struct Gather {
        std::map<int, std::string> data;  // by rank: who arrived, and with what
        std::vector<GatherWaiter> waiters;
    };

    int poll_timeout_ms() const {
        auto next = Clock::now() + std::chrono::milliseconds(200);  // also re-checks the stop condition
        for (auto& w : key_waiters_) next = std::min(next, w.deadline);
        for (auto& [k, g] : gathers_)
            for (auto& w : g.waiters) next = std::min(next, w.deadline);
        return net::ms_left(next) + 1;
    }

    void accept_all() {
        while (true) {
            int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) return;  // EAGAIN, or a transient error: poll will report the listener again
            int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            conns_.emplace(next_id_++, Conn{fd, -1, {}, {}});
        }
    }

    void close_conn(std::uint64_t id) {
        auto it = conns_.find(id);
        if (it == conns_.end()) return;
        ::close(it->second.fd);
        conns_.erase(it);
        // Its parked requests die with it; arrivals at barriers stay recorded (the rank did arrive).
        std::erase_if(key_waiters_, [&](const KeyWaiter& w) { return w.conn == id; });
        for (auto& [k, g] : gathers_) std::erase_if(g.waiters, [&](const GatherWaiter& w) { return w.conn == id; });
    }

    void flush(std::uint64_t id) {
        Conn& c = conns_.at(id);
        while (!c.out.empty()) {
            ssize_t w = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) return;
                close_conn(id);
                return;
            }
            c.out.erase(0, static_cast<std::size_t>(w));
        }
    }

    void reply(std::uint64_t id, const net::Writer& body) {
        auto it = conns_.find(id);
        if (it == conns_.end()) return;
        it->second.out += body.frame();
        flush(id);
    }

    void reply_ok(std::uint64_t id) { reply(id, net::Writer().u8(static_cast<std::uint8_t>(Status::Ok))); }

    void reply_error(std::uint64_t id, const std::string& msg) {
        reply(id, net::Writer().u8(static_cast<std::uint8_t>(Status::Error)).bytes(msg));
    }

    void read_from(std::uint64_t id) {
        char buf[65536];
        while (true) {
            Conn& c = conns_.at(id);
            ssize_t r = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (r == 0) {
                close_conn(id);
                return;
            }
            if (r < 0) {
                if (errno == EINTR) continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK) close_conn(id);
                break;
            }
            c.in.append(buf, static_cast<std::size_t>(r));
        }
        // Handle every complete frame; a malformed one closes the connection (not a Loom client, or out of step).
        while (conns_.count(id)) {
            Conn& c = conns_.at(id);
            if (c.in.size() < 4) return;
            std::uint32_t len = net::Reader(std::string_view(c.in).substr(0, 4)).u32();
            if (len > net::kMaxFrame) {
                close_conn(id);
                return;
            }
            if (c.in.size() < 4 + std::size_t(len)) return;
            std::string body = c.in.substr(4, len);
            c.in.erase(0, 4 + std::size_t(len));
            try {
                handle(id, body);
            } catch (const std::exception&) {
                close_conn(id);
                return;
            }
        }
    }

    void handle(std::uint64_t id, const std::string& body) {
        net::Reader r(body);
        auto op = static_cast<Op>(r.u8());
        std::uint32_t timeout_ms = r.u32();
        auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
        Conn& c = conns_.at(id);
        switch (op) {
            case Op::Hello: {
                int rank = r.i32(), world = r.i32();
                if (world != world_)
                    return reply_error(id, fmt::format("rank {} expects world size {}, but the store (rank 0) was "
                                                       "created for world size {}",
                                                       rank, world, world_));
                if (rank < 0 || rank >= world_)
                    return reply_error(id, fmt::format("rank {} out of range [0, {})", rank, world_));
                c.rank = rank;
                return reply_ok(id);
            }
            case Op::Set: {
                std::string key(r.bytes()), value(r.bytes());
                kv_[key] = std::move(value);
                reply_ok(id);
                return wake_key_waiters();
            }
            case Op::Get:
            case Op::Wait: {
                std::vector<std::string> keys;
                if (op == Op::Get) {
                    keys.emplace_back(r.bytes());
                } else {
                    for (std::uint32_t n = r.u32(), i = 0; i < n; ++i) keys.emplace_back(r.bytes());
                }
                key_waiters_.push_back({id, op, std::move(keys), deadline, timeout_ms});
                return wake_key_waiters();
            }
            case Op::Check: {
                std::string key(r.bytes());
                return reply(id, net::Writer().u8(0).u8(kv_.count(key) ? 1 : 0));
            }
            case Op::Add: {
                std::string key(r.bytes());
                std::int64_t delta = r.i64();
                std::int64_t value = 0;
                if (auto it = kv_.find(key); it != kv_.end()) {
                    auto old = parse_i64(it->second);
                    if (!old)
                        return reply_error(id, fmt::format("add on key \"{}\": expected an integer value, found {} "
                                                           "bytes that are not one",
                                                           key, it->second.size()));
                    value = *old;
                }
                if (__builtin_add_overflow(value, delta, &value))
                    return reply_error(id, fmt::format("add on key \"{}\": 64-bit overflow", key));
                kv_[key] = std::to_string(value);
                reply(id, net::Writer().u8(0).i64(value));
                return wake_key_waiters();
            }
            case Op::Gather: {
                std::string key(r.bytes());
                int rank = r.i32(), world = r.i32();
                std::string data(r.bytes());
                if (world != world_ || rank < 0 || rank >= world_)
                    return reply_error(id, fmt::format("\"{}\": rank {} of world size {} arrived at a store for "
                                                       "world size {}",
                                                       key, rank, world, world_));
                Gather& g = gathers_[key];
                if (g.data.count(rank))
                    return reply_error(id, fmt::format("\"{}\": rank {} arrived twice (every rank must call with "
                                                       "the same tag sequence)",
                                                       key, rank));
                g.data.emplace(rank, std::move(data));
                g.waiters.push_back({id, rank, deadline, timeout_ms});
                if (static_cast<int>(g.data.size()) == world_) {
                    net::Writer w;
                    w.u8(0).u32(static_cast<std::uint32_t>(world_));
                    for (auto& [rk, d] : g.data) w.bytes(d);
                    std::string frame = w.frame();
                    for (auto& gw : g.waiters)
                        if (auto it = conns_.find(gw.conn); it != conns_.end()) {
                            it->second.out += frame;
                            flush(gw.conn);
                        }
                    gathers_.erase(key);
                }
                return;
            }
        }
        throw std::runtime_error("unknown op");
    }

    // Answers every parked get/wait whose keys all exist.
    void wake_key_waiters() {
        std::vector<KeyWaiter> ready;
        std::erase_if(key_waiters_, [&](const KeyWaiter& w) {
            bool all = std::all_of(w.keys.begin(), w.keys.end(), [&](auto& k) { return kv_.count(k) > 0; });
            if (all) ready.push_back(w);
            return all;
        });
        for (auto& w : ready) {
            if (w.op == Op::Get)
                reply(w.conn, net::Writer().u8(0).bytes(kv_.at(w.keys[0])));
            else
                reply_ok(w.conn);
        }
    }

    void expire(Clock::time_point now) {
        std::vector<KeyWaiter> late;
        std::erase_if(key_waiters_, [&](const KeyWaiter& w) {
            if (w.deadline > now) return false;
            late.push_back(w);
            return true;
        });
        for (auto& w : late) {
            std::vector<std::string> missing;
            for (auto& k : w.keys)
                if (!kv_.count(k)) missing.push_back(fmt::format("\"{}\"", k));
            reply_error(w.conn, fmt::format("timed out after {} ms waiting for key {} (never set)", w.timeout_ms,
                                            fmt::join(missing, ", ")));
        }
        for (auto& [key, g] : gathers_) {
            std::vector<GatherWaiter> late_g;
            std::erase_if(g.waiters, [&](const GatherWaiter& w) {
                if (w.deadline > now) return false;
                late_g.push_back(w);
                return true;
            });
            if (late_g.empty()) continue;
            std::vector<int> arrived, missing;
            for (int rk = 0; rk < world_; ++rk) (g.data.count(rk) ? arrived : missing).push_back(rk);
            for (auto& w : late_g)
                reply_error(w.conn, fmt::format("timed out after {} ms at \"{}\": ranks {} never arrived (arrived: {})",
                                                w.timeout_ms, key, rank_list(missing), rank_list(arrived)));
        }
    }

    int listen_fd_, wake_fd_, world_;
    std::uint64_t next_id_ = 1;
    std::map<std::uint64_t, Conn> conns_;
    std::unordered_map<std::string, std::string> kv_;
    std::vector<KeyWaiter> key_waiters_;
    std::unordered_map<std::string, Gather> gathers_;
};

}  // namespace

StoreServer::StoreServer(const std::string& addr, int port, int world_size) : world_size_(world_size) {
    listen_fd_ = net::tcp_listen(addr, port, &port_);
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
        int err = errno;
        ::close(listen_fd_);
        detail::throw_errno(err, "pipe2", __FILE__, __LINE__);
    }
    thread_ = std::thread([this] { serve(); });
}

StoreServer::~StoreServer() {
    stop(std::chrono::milliseconds(0));
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
}

void StoreServer::stop(std::chrono::milliseconds drain) {
    if (!thread_.joinable()) return;
    drain_until_ns_ =
        std::chrono::duration_cast<std::chrono::nanoseconds>((Clock::now() + drain).time_since_epoch()).count();
    stopping_ = true;
    char b = 1;
    [[maybe_unused]] auto n = ::write(wake_[1], &b, 1);
    thread_.join();
}

void StoreServer::serve() {
    Loop loop(listen_fd_, wake_[0], world_size_);
    loop.run([this](bool no_clients) {
        if (!stopping_) return false;
        auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
        return no_clients || now >= drain_until_ns_.load();
    });
}

}  // namespace loom
