#include "store_server.hpp"

#include <arpa/inet.h>
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
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "loom/runtime/error.hpp"
#include "runtime/log.hpp"
#include "socket_util.hpp"

namespace loom {
namespace {

using net::Clock;
using store_wire::Op;
using store_wire::Status;

// A request refused with an error reply; the connection stays in step and usable.
struct RequestError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

constexpr std::size_t kOutLowWater = 64 << 10;  // a connection's next request waits until its replies drain below
constexpr int kMaxAcceptsPerPass = 8;  // then poll again: hellos of accepted clients are read before more are shed
constexpr int kMaxFramesPerPass = 64;  // per connection and loop pass, so that one client cannot starve the others
constexpr auto kFdBackoff = std::chrono::milliseconds(100);  // accept() pause when no descriptor can be freed
constexpr auto kMaxPoll = std::chrono::milliseconds(200);    // also re-checks the stop condition

// What the server reports, once per kind.
enum class Event { Garbage, BadToken, HelloTimeout, FrameTimeout, SendStall, Error, FdLimit, AcceptFailed, Count };

std::string rank_list(const std::vector<int>& ranks) { return fmt::format("[{}]", fmt::join(ranks, ", ")); }

std::optional<std::int64_t> parse_i64(const std::string& s) {
    if (s.empty() || s.size() > 20) return std::nullopt;
    std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (i == s.size()) return std::nullopt;
    for (std::size_t j = i; j < s.size(); ++j)
        if (s[j] < '0' || s[j] > '9') return std::nullopt;
    errno = 0;
    long long v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == ERANGE) return std::nullopt;
    return v;
}

std::string peer_name(int fd) {
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    char ip[INET_ADDRSTRLEN] = "?";
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0 && sa.sin_family == AF_INET)
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    return fmt::format("{}:{}", ip, ntohs(sa.sin_port));
}

// An outgoing frame, shared by every connection it goes to (an all-gather's reply goes to every rank).
using Frame = std::shared_ptr<const std::string>;

// The loop's state; lives on the server thread only, so it needs no lock (the stats box has its own).
class Loop {
  public:
    Loop(int listen_fd, int wake_fd, int world_size, const store_auth::Token& token, const StoreLimits& limits,
         StoreServer::StatsBox& box)
        : listen_fd_(listen_fd),
          wake_fd_(wake_fd),
          world_(world_size),
          token_(token),
          limits_(limits),
          max_frame_(limits.max_key + limits.max_value + 64),
          box_(box),
          joined_(static_cast<std::size_t>(world_size), false),
          spare_fd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

    ~Loop() {
        for (auto& [id, c] : conns_) ::close(c.fd);
        if (spare_fd_ >= 0) ::close(spare_fd_);
    }

    // Runs until `should_stop(no_members)` says so (no connection of a rank that has joined is left). Nothing thrown
    // while serving leaves the loop.
    template <class StopFn>
    void run(StopFn should_stop) {
        while (!should_stop(std::none_of(conns_.begin(), conns_.end(), [](auto& kv) { return kv.second.rank >= 0; }))) {
            try {
                pass();
            } catch (const std::exception& e) {
                warn_once(Event::Error, fmt::format("serving failed ({}); carrying on", e.what()));
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            } catch (...) {
                warn_once(Event::Error, "serving failed (unknown exception); carrying on");
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
        }
    }

  private:
    struct OutChunk {
        Frame frame;
        std::size_t sent = 0;
    };
    struct Conn {
        int fd = -1;
        Clock::time_point accepted;
        std::string peer;
        int rank = -1;  // set by an accepted hello
        std::string in;
        std::deque<OutChunk> out;
        std::size_t out_bytes = 0;
        bool busy = false;                               // a request is parked; later frames wait
        std::optional<Clock::time_point> partial_since;  // an incomplete frame heads `in` since then
        std::optional<Clock::time_point> stalled_since;  // replies pending, no byte sent since then
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
        Clock::time_point deadline;
        std::uint32_t timeout_ms;
    };
    struct Gather {
        std::map<int, std::string> data;  // by rank: who arrived, and with what
        std::size_t bytes = 0;            // the key and every contribution, as counted in stored_
        std::vector<GatherWaiter> waiters;
    };

    Conn* find(std::uint64_t id) {
        auto it = conns_.find(id);
        return it == conns_.end() ? nullptr : &it->second;
    }

    std::size_t in_cap(const Conn& c) const {
        return 4 + (c.rank < 0 ? store_wire::kMaxHelloFrame : static_cast<std::uint32_t>(max_frame_));
    }

    // The frame at the head of `in` is complete.
    static bool head_complete(const Conn& c) {
        if (c.in.size() < 4) return false;
        return c.in.size() >= 4 + std::size_t(net::Reader(std::string_view(c.in).substr(0, 4)).u32());
    }

    bool ready(const Conn& c) const { return !c.busy && c.out_bytes < kOutLowWater && head_complete(c); }

    void warn_once(Event e, const std::string& what) {
        auto& warned = warned_[static_cast<int>(e)];
        if (warned) return;
        warned = true;
        try {
            loom::log(LogLevel::Warn, "store server: {} (later events of this kind are counted, not reported)", what);
        } catch (...) {
        }
    }

    // Runs `fn` for one connection; whatever it throws closes that connection only.
    template <class Fn>
    void guarded(std::uint64_t id, Fn&& fn) {
        try {
            fn();
        } catch (const std::exception& e) {
            drop(id, Event::Error, fmt::format("closed a connection after an error while serving it: {}", e.what()));
        } catch (...) {
            drop(id, Event::Error, "closed a connection after an unknown error while serving it");
        }
    }

    void pass() {
        const auto start = Clock::now();
        fds_.clear();
        ids_.clear();
        fds_.push_back({wake_fd_, POLLIN, 0});
        fds_.push_back({start >= listen_paused_until_ ? listen_fd_ : -1, POLLIN, 0});  // fd -1: not polled
        for (auto& [id, c] : conns_) {
            short events = POLLRDHUP;
            if (c.in.size() < in_cap(c)) events |= POLLIN;
            if (c.out_bytes) events |= POLLOUT;
            fds_.push_back({c.fd, events, 0});
            ids_.push_back(id);
        }
        int rc = ::poll(fds_.data(), fds_.size(), poll_timeout_ms(start));
        if (rc < 0) {
            if (errno == EINTR) return;
            detail::throw_errno(errno, "poll", __FILE__, __LINE__);
        }
        ++stats_.polls;
        if (rc > 0) {
            if (fds_[0].revents) {
                char buf[64];
                while (::read(wake_fd_, buf, sizeof(buf)) > 0) {
                }
            }
            if (fds_[1].revents & POLLIN) accept_some();
            for (std::size_t i = 2; i < fds_.size(); ++i)
                if (short rev = fds_[i].revents) guarded(ids_[i - 2], [&] { on_events(ids_[i - 2], rev); });
        }
        note_buffered();
        const auto now = Clock::now();
        ids_.clear();
        for (auto& [id, c] : conns_)
            if (ready(c) || !c.in.empty()) ids_.push_back(id);
        for (auto id : ids_) guarded(id, [&] { process(id, now); });
        expire(now);
        note_buffered();
        publish();
    }

    int poll_timeout_ms(Clock::time_point now) const {
        auto next = now + kMaxPoll;
        for (auto& [id, c] : conns_) {
            if (ready(c)) return 0;
            if (c.rank < 0) next = std::min(next, c.accepted + limits_.hello_timeout);
            if (c.partial_since) next = std::min(next, *c.partial_since + limits_.frame_timeout);
            if (c.stalled_since) next = std::min(next, *c.stalled_since + limits_.frame_timeout);
        }
        for (auto& w : key_waiters_) next = std::min(next, w.deadline);
        for (auto& [k, g] : gathers_)
            for (auto& w : g.waiters) next = std::min(next, w.deadline);
        if (listen_paused_until_ > now) next = std::min(next, listen_paused_until_);
        return net::ms_left(next) + 1;
    }

    // ---- connections ----

    void accept_some() {
        for (int i = 0; i < kMaxAcceptsPerPass; ++i) {
            int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                const int err = errno;
                if (err == EAGAIN || err == EWOULDBLOCK) return;
                if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
                if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
                    ++stats_.fd_exhausted;
                    warn_once(Event::FdLimit, fmt::format("accept() failed ({}); closing connections that have not "
                                                          "said hello to make room",
                                                          std::strerror(err)));
                    if (shed_one()) continue;  // a descriptor is free again
                    refuse_with_spare();
                } else {
                    warn_once(Event::AcceptFailed, fmt::format("accept() failed: {}", std::strerror(err)));
                }
                listen_paused_until_ = Clock::now() + kFdBackoff;  // no spin on a listener we cannot serve
                return;
            }
            ++stats_.accepted;
            int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            if (static_cast<long>(conns_.size()) >= long{world_} + limits_.spare_connections && !shed_one()) {
                ::close(fd);
                ++stats_.shed;
                continue;
            }
            const std::uint64_t id = next_id_++;
            const auto now = Clock::now();
            Conn c;
            c.fd = fd;
            c.accepted = now;
            c.peer = peer_name(fd);
            conns_.emplace(id, std::move(c));
            // A client sends its hello right after connecting: read it now, before later connections can shed it.
            guarded(id, [&] {
                read_from(id);
                process(id, now);
            });
        }
    }

    // Closes the oldest connection that has not said hello, preferring one that has sent nothing.
    bool shed_one() {
        auto victim = conns_.end();
        for (auto it = conns_.begin(); it != conns_.end(); ++it) {
            if (it->second.rank >= 0) continue;
            if (it->second.in.empty()) {
                victim = it;
                break;
            }
            if (victim == conns_.end()) victim = it;
        }
        if (victim == conns_.end()) return false;
        ++stats_.shed;
        close_conn(victim->first);
        return true;
    }

    // At the descriptor limit with nothing to shed: accept the newest connection on the spare descriptor and
    // close it, so that the listener does not stay readable.
    void refuse_with_spare() {
        if (spare_fd_ < 0) return;
        ::close(spare_fd_);
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
            ::close(fd);
            ++stats_.shed;
        }
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
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

    void drop(std::uint64_t id, Event why, const std::string& what) {
        Conn* c = find(id);
        if (!c) return;
        ++stats_.dropped;
        warn_once(why, fmt::format("{} (peer {}, {})", what, c->peer,
                                   c->rank >= 0 ? fmt::format("rank {}", c->rank) : std::string("before its hello")));
        close_conn(id);
    }

    void on_events(std::uint64_t id, short rev) {
        if (rev & POLLOUT) flush(id);
        if (find(id) && (rev & POLLIN)) read_from(id);
        if (find(id) && (rev & (POLLHUP | POLLERR | POLLRDHUP))) {
            // The peer is gone or has stopped sending; what it sent is read, but it can no longer be answered.
            close_conn(id);
        }
    }

    void read_from(std::uint64_t id) {
        char buf[65536];
        for (Conn* c = find(id); c && c->in.size() < in_cap(*c);) {
            const std::size_t want = std::min(sizeof(buf), in_cap(*c) - c->in.size());
            ssize_t r = ::recv(c->fd, buf, want, MSG_DONTWAIT);
            if (r == 0) return close_conn(id);
            if (r < 0) {
                if (errno == EINTR) continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK) close_conn(id);
                return;
            }
            const std::size_t need = c->in.size() + static_cast<std::size_t>(r);
            if (need > c->in.capacity()) c->in.reserve(std::min(in_cap(*c), std::max(need, 2 * c->in.capacity())));
            c->in.append(buf, static_cast<std::size_t>(r));
        }
    }

    void flush(std::uint64_t id) {
        Conn* c = find(id);
        while (c && !c->out.empty()) {
            OutChunk& chunk = c->out.front();
            const std::string& f = *chunk.frame;
            ssize_t w = ::send(c->fd, f.data() + chunk.sent, f.size() - chunk.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) return;
                return close_conn(id);
            }
            chunk.sent += static_cast<std::size_t>(w);
            c->out_bytes -= static_cast<std::size_t>(w);
            c->stalled_since = Clock::now();
            if (chunk.sent == f.size()) c->out.pop_front();
        }
        if (c) c->stalled_since.reset();
    }

    void send(std::uint64_t id, Frame frame) {
        Conn* c = find(id);
        if (!c) return;
        c->out_bytes += frame->size();
        c->out.push_back({std::move(frame), 0});
        if (!c->stalled_since) c->stalled_since = Clock::now();
        flush(id);
    }

    void reply(std::uint64_t id, const net::Writer& body) {
        send(id, std::make_shared<const std::string>(body.frame()));
    }
    void reply_ok(std::uint64_t id) { reply(id, net::Writer().u8(static_cast<std::uint8_t>(Status::Ok))); }
    void reply_error(std::uint64_t id, const std::string& msg) {
        reply(id, net::Writer().u8(static_cast<std::uint8_t>(Status::Error)).bytes(msg));
    }

    // Answers a refused hello and closes the connection.
    void refuse(std::uint64_t id, const std::string& msg) {
        ++stats_.refused;
        reply(id, net::Writer().u8(static_cast<std::uint8_t>(Status::Refused)).bytes(msg));
        close_conn(id);
    }

    void park(std::uint64_t id) { conns_.at(id).busy = true; }
    void unpark(std::uint64_t id) {
        if (Conn* c = find(id)) c->busy = false;
    }

    // Handles the complete frames heading the connection's input, one request at a time.
    void process(std::uint64_t id, Clock::time_point now) {
        for (int n = 0; n < kMaxFramesPerPass; ++n) {
            Conn* c = find(id);
            if (!c) return;
            if (c->busy || c->out_bytes >= kOutLowWater || c->in.size() < 4) break;
            const std::uint32_t len = net::Reader(std::string_view(c->in).substr(0, 4)).u32();
            const std::size_t limit = c->rank < 0 ? store_wire::kMaxHelloFrame : max_frame_;
            if (len == 0 || len > limit)
                return drop(id, Event::Garbage,
                            fmt::format("closed a connection that sent a frame of {} bytes (expected 1..{}{})", len,
                                        limit, c->rank < 0 ? ", a hello" : ""));
            if (c->in.size() < 4 + std::size_t(len)) break;
            std::string body = c->in.substr(4, len);
            c->in.erase(0, 4 + std::size_t(len));
            handle(id, body);
        }
        if (Conn* c = find(id)) {
            if (c->in.empty() && c->in.capacity() > kOutLowWater) std::string().swap(c->in);  // give back a big frame
            if (!c->in.empty() && !head_complete(*c)) {
                if (!c->partial_since) c->partial_since = now;
            } else {
                c->partial_since.reset();
            }
        }
    }

    // ---- requests ----

    void handle(std::uint64_t id, const std::string& body) {
        net::Reader r(body);
        const auto op = static_cast<Op>(r.u8());
        const std::uint32_t timeout_ms = r.u32();
        if (conns_.at(id).rank < 0) {
            if (op != Op::Hello)
                return drop(id, Event::Garbage, "closed a connection that sent a request before its hello");
            try {
                return hello(id, r);
            } catch (const Error& e) {
                return drop(id, Event::Garbage,
                            fmt::format("closed a connection that sent a malformed hello ({})", e.what()));
            }
        }
        try {
            request(id, op, r, timeout_ms);
        } catch (const RequestError& e) {
            reply_error(id, e.what());
        }
    }

    void hello(std::uint64_t id, net::Reader& r) {
        const std::string_view token = r.bytes();
        const int rank = r.i32(), world = r.i32();
        LOOM_CHECK(r.done(), "malformed hello: trailing bytes");
        if (!store_auth::same_token(token, token_)) {
            warn_once(Event::BadToken,
                      fmt::format("refused a hello with a wrong job token (peer {})", conns_.at(id).peer));
            return refuse(id, store_wire::kWrongToken);
        }
        if (world != world_)
            return refuse(id, fmt::format("rank {} expects world size {}, but the store (rank 0) was created for "
                                          "world size {}",
                                          rank, world, world_));
        if (rank < 0 || rank >= world_) return refuse(id, fmt::format("rank {} out of range [0, {})", rank, world_));
        if (joined_[static_cast<std::size_t>(rank)]) {
            // A live connection of that rank: two processes were given it. None: the rank left this store (an
            // earlier World's, still draining) and is joining the next World's: it retries.
            const bool live =
                std::any_of(conns_.begin(), conns_.end(), [&](const auto& c) { return c.second.rank == rank; });
            if (!live) return refuse(id, store_wire::kRankLeft);
            return refuse(id, fmt::format("rank {} {} (one connection per rank: were two processes given rank {}?)",
                                          rank, store_wire::kAlreadyJoined, rank));
        }
        joined_[static_cast<std::size_t>(rank)] = true;
        conns_.at(id).rank = rank;
        ++stats_.joined;
        reply_ok(id);
    }

    std::string read_key(net::Reader& r) const {
        std::string_view k = r.bytes();
        if (k.size() > limits_.max_key)
            throw RequestError(fmt::format("key of {} bytes: expected at most {} bytes", k.size(), limits_.max_key));
        return std::string(k);
    }

    std::string read_value(net::Reader& r, const std::string& key) const {
        std::string_view v = r.bytes();
        if (v.size() > limits_.max_value)
            throw RequestError(fmt::format("value of \"{}\" has {} bytes: expected at most {} bytes", key, v.size(),
                                           limits_.max_value));
        return std::string(v);
    }

    // Raises unless `more` bytes fit the store.
    void reserve(std::size_t more, const std::string& key) const {
        if (stored_ + more > limits_.max_stored)
            throw RequestError(
                fmt::format("the store is full: it holds {} bytes (at most {}), and \"{}\" needs {} "
                            "more",
                            stored_, limits_.max_stored, key, more));
    }

    void store_value(const std::string& key, std::string value) {
        auto it = kv_.find(key);
        const std::size_t old = it == kv_.end() ? 0 : key.size() + it->second.size();
        const std::size_t now = key.size() + value.size();
        if (now > old) reserve(now - old, key);
        stored_ = stored_ - old + now;
        stats_.peak_stored = std::max(stats_.peak_stored, stored_);
        kv_[key] = std::move(value);
    }

    void request(std::uint64_t id, Op op, net::Reader& r, std::uint32_t timeout_ms) {
        const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
        switch (op) {
            case Op::Hello:
                throw RequestError("a second hello on one connection");
            case Op::Set: {
                std::string key = read_key(r);
                store_value(key, read_value(r, key));
                reply_ok(id);
                return wake_key_waiters();
            }
            case Op::Get:
            case Op::Wait: {
                std::vector<std::string> keys;
                if (op == Op::Get) {
                    keys.push_back(read_key(r));
                } else {
                    for (std::uint32_t n = r.u32(), i = 0; i < n; ++i) keys.push_back(read_key(r));
                }
                park(id);
                key_waiters_.push_back({id, op, std::move(keys), deadline, timeout_ms});
                return wake_key_waiters();
            }
            case Op::Check: {
                std::string key = read_key(r);
                return reply(id, net::Writer().u8(0).u8(kv_.count(key) ? 1 : 0));
            }
            case Op::Add: {
                std::string key = read_key(r);
                const std::int64_t delta = r.i64();
                std::int64_t value = 0;
                if (auto it = kv_.find(key); it != kv_.end()) {
                    auto old = parse_i64(it->second);
                    if (!old)
                        throw RequestError(
                            fmt::format("add on key \"{}\": expected an integer value, found {} bytes "
                                        "that are not one",
                                        key, it->second.size()));
                    value = *old;
                }
                if (__builtin_add_overflow(value, delta, &value))
                    throw RequestError(fmt::format("add on key \"{}\": 64-bit overflow", key));
                store_value(key, std::to_string(value));
                reply(id, net::Writer().u8(0).i64(value));
                return wake_key_waiters();
            }
            case Op::Gather:
                return gather(id, r, deadline, timeout_ms);
        }
        LOOM_FAIL("unknown store op {}", static_cast<int>(op));
    }

    void gather(std::uint64_t id, net::Reader& r, Clock::time_point deadline, std::uint32_t timeout_ms) {
        const std::string key = read_key(r);
        const int rank = r.i32(), world = r.i32();
        std::string data = read_value(r, key);
        const int mine = conns_.at(id).rank;
        if (world != world_)
            throw RequestError(fmt::format("\"{}\": rank {} of world size {} arrived at a store for world size {}", key,
                                           rank, world, world_));
        if (rank != mine)
            throw RequestError(
                fmt::format("\"{}\": the request names rank {}, but this connection is rank {}", key, rank, mine));
        auto it = gathers_.find(key);
        if (it != gathers_.end() && it->second.data.count(rank))
            throw RequestError(
                fmt::format("\"{}\": rank {} arrived twice (every rank must call with the same tag "
                            "sequence)",
                            key, rank));
        const std::size_t more = data.size() + (it == gathers_.end() ? key.size() : 0);
        reserve(more, key);
        Gather& g = gathers_[key];
        g.data.emplace(rank, std::move(data));
        g.bytes += more;
        stored_ += more;
        stats_.peak_stored = std::max(stats_.peak_stored, stored_);
        park(id);
        g.waiters.push_back({id, deadline, timeout_ms});
        if (static_cast<int>(g.data.size()) < world_) return;
        net::Writer w;
        w.u8(0).u32(static_cast<std::uint32_t>(world_));
        for (auto& [rk, d] : g.data) w.bytes(d);
        auto frame = std::make_shared<const std::string>(w.frame());
        std::vector<GatherWaiter> waiters = std::move(g.waiters);
        stored_ -= g.bytes;
        gathers_.erase(key);
        for (auto& gw : waiters) {
            unpark(gw.conn);
            send(gw.conn, frame);
        }
    }

    // Answers every parked get/wait whose keys all exist.
    void wake_key_waiters() {
        std::vector<KeyWaiter> ready;
        std::erase_if(key_waiters_, [&](KeyWaiter& w) {
            bool all = std::all_of(w.keys.begin(), w.keys.end(), [&](auto& k) { return kv_.count(k) > 0; });
            if (all) ready.push_back(std::move(w));
            return all;
        });
        for (auto& w : ready) {
            unpark(w.conn);
            if (w.op == Op::Get)
                reply(w.conn, net::Writer().u8(0).bytes(kv_.at(w.keys[0])));
            else
                reply_ok(w.conn);
        }
    }

    void expire(Clock::time_point now) {
        std::vector<KeyWaiter> late;
        std::erase_if(key_waiters_, [&](KeyWaiter& w) {
            if (w.deadline > now) return false;
            late.push_back(std::move(w));
            return true;
        });
        for (auto& w : late) {
            std::vector<std::string> missing;
            for (auto& k : w.keys)
                if (!kv_.count(k)) missing.push_back(fmt::format("\"{}\"", k));
            unpark(w.conn);
            guarded(w.conn, [&] {
                reply_error(w.conn, fmt::format("timed out after {} ms waiting for key {} (never set)", w.timeout_ms,
                                                fmt::join(missing, ", ")));
            });
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
            for (auto& w : late_g) {
                unpark(w.conn);
                guarded(w.conn, [&] {
                    reply_error(w.conn,
                                fmt::format("timed out after {} ms at \"{}\": ranks {} never arrived (arrived: {})",
                                            w.timeout_ms, key, rank_list(missing), rank_list(arrived)));
                });
            }
        }
        std::vector<std::pair<std::uint64_t, Event>> stale;
        for (auto& [id, c] : conns_) {
            if (c.rank < 0 && now >= c.accepted + limits_.hello_timeout)
                stale.push_back({id, Event::HelloTimeout});
            else if (c.partial_since && now >= *c.partial_since + limits_.frame_timeout)
                stale.push_back({id, Event::FrameTimeout});
            else if (c.stalled_since && now >= *c.stalled_since + limits_.frame_timeout)
                stale.push_back({id, Event::SendStall});
        }
        for (auto& [id, why] : stale) {
            const char* what = why == Event::HelloTimeout   ? "sent no hello"
                               : why == Event::FrameTimeout ? "left a frame incomplete"
                                                            : "stopped reading its replies";
            drop(id, why,
                 fmt::format("closed a connection that {} for {} ms", what,
                             (why == Event::HelloTimeout ? limits_.hello_timeout : limits_.frame_timeout).count()));
        }
    }

    // ---- accounting ----

    void note_buffered() {
        std::size_t bytes = 0;
        for (auto& [id, c] : conns_) bytes += c.in.capacity() + c.out_bytes;
        stats_.peak_buffered = std::max(stats_.peak_buffered, bytes);
    }

    void publish() {
        std::lock_guard<std::mutex> lock(box_.mu);
        box_.s = stats_;
    }

    int listen_fd_, wake_fd_, world_;
    store_auth::Token token_;
    StoreLimits limits_;
    std::size_t max_frame_;  // largest request after the hello: a key, a value and the fixed fields
    StoreServer::StatsBox& box_;
    StoreServerStats stats_;
    std::vector<bool> joined_;  // ranks that have said hello, ever: one connection per rank
    int spare_fd_;              // released to refuse a connection at the descriptor limit
    Clock::time_point listen_paused_until_{};
    bool warned_[static_cast<int>(Event::Count)] = {};
    std::uint64_t next_id_ = 1;
    std::map<std::uint64_t, Conn> conns_;  // by id: oldest first
    std::unordered_map<std::string, std::string> kv_;
    std::size_t stored_ = 0;  // keys + values in kv_, plus every pending gather's bytes
    std::vector<KeyWaiter> key_waiters_;
    std::unordered_map<std::string, Gather> gathers_;
    std::vector<pollfd> fds_;
    std::vector<std::uint64_t> ids_;
};

}  // namespace

StoreServer::StoreServer(const std::string& addr, int port, int world_size, const store_auth::Token& token,
                         const StoreLimits& limits)
    : addr_(addr), world_size_(world_size), token_(token), limits_(limits) {
    listen_fd_ = net::tcp_bind(addr, port, &port_);
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
        int err = errno;
        ::close(listen_fd_);
        detail::throw_errno(err, "pipe2", __FILE__, __LINE__);
    }
}

StoreServer::~StoreServer() {
    stop(std::chrono::milliseconds(0));
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
}

void StoreServer::start() {
    LOOM_CHECK(!thread_.joinable(), "StoreServer::start: already serving");
    net::tcp_listen(listen_fd_, addr_, port_);
    thread_ = std::thread([this] { serve(); });
}

StoreServerStats StoreServer::stats() const {
    std::lock_guard<std::mutex> lock(stats_.mu);
    return stats_.s;
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
    try {
        Loop loop(listen_fd_, wake_[0], world_size_, token_, limits_, stats_);
        loop.run([this](bool no_members) {
            if (!stopping_) return false;
            auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
            return no_members || now >= drain_until_ns_.load();
        });
    } catch (const std::exception& e) {
        std::fprintf(stderr, "loom: store server stopped: %s\n", e.what());
    } catch (...) {
        std::fprintf(stderr, "loom: store server stopped after an unknown error\n");
    }
}

}  // namespace loom
