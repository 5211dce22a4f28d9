// Bootstrap store client; rank 0 also owns the server (store_server.cpp).
#include "loom/runtime/store.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "runtime/store_auth.hpp"
#include "socket_util.hpp"
#include "store_server.hpp"

namespace loom {

using net::Clock;
using store_wire::Op;
using store_wire::Status;

namespace {
// Slack on the client's own deadline beyond the server-applied timeout: the server answers a timed-out wait
// with the names of what is missing; the client's deadline only catches a server that stopped answering.
constexpr auto kClientGrace = std::chrono::milliseconds(2000);
// Bound on how long rank 0's destructor keeps serving ranks that are still finishing.
constexpr auto kMaxDrain = std::chrono::milliseconds(10000);
// How long a hello refused as "already joined" is retried: rank 0 serves the previous World's store for up to
// kMaxDrain after its ranks left, and may see a rank's closed connection after its next hello.
constexpr auto kRejoinGrace = kMaxDrain + std::chrono::milliseconds(2000);

// How this rank learns the job token (store_auth.hpp).
enum class TokenSource { Secret, Generated, File };

void check_key(const std::string& what, const std::string& key) {
    LOOM_CHECK(key.size() <= Store::kMaxKeyBytes, "{}: key of {} bytes; expected at most {} bytes", what, key.size(),
               Store::kMaxKeyBytes);
}

void check_value(const std::string& what, std::size_t bytes) {
    LOOM_CHECK(bytes <= Store::kMaxValueBytes, "{}: value of {} bytes; expected at most {} bytes", what, bytes,
               Store::kMaxValueBytes);
}

}  // namespace

struct Store::Impl {
    int rank, world;
    std::string addr;
    int port;
    std::chrono::milliseconds timeout;
    TokenSource source = TokenSource::Secret;
    store_auth::Token token{};                 // unless source == File: read after connecting
    std::unique_ptr<StoreServer> server;       // rank 0 only
    bool wrote_token_file = false;             // rank 0: remove it when the server stops
    Clock::time_point rejoin_refused_since{};  // the first "already joined" refusal of this connect
    std::string rejoin_refused;                // its text

    std::mutex mu;  // serialises requests on the one connection, and guards the fields below
    int fd = -1;
    std::string broken;  // why the connection is unusable; empty while it is fine
    std::map<std::string, std::uint64_t> barrier_calls, gather_calls;

    // Also runs when a constructor throws half-way, so a failed connect leaves no socket behind.
    ~Impl() {
        if (fd >= 0) ::close(fd);
        if (server) server->stop(std::min(timeout, kMaxDrain));
        if (wrote_token_file) store_auth::remove_token_file(port);
    }

    std::string where() const { return fmt::format("store at {}:{}", addr, port); }

    // [u32 length][u8 op][u32 timeout][fields]
    std::string frame(Op op, const net::Writer& fields) const {
        net::Writer body;
        body.u8(static_cast<std::uint8_t>(op)).u32(static_cast<std::uint32_t>(timeout.count()));
        std::string f = body.frame() + fields.data();
        const auto len = static_cast<std::uint32_t>(f.size() - 4);  // the header covers op + timeout + fields
        for (int i = 0; i < 4; ++i) f[i] = static_cast<char>((len >> (8 * i)) & 0xff);
        return f;
    }

    // Sends `f` and receives one reply body; false with `why` ("closed", "timeout", ...) on failure.
    bool round_trip(const std::string& f, Clock::time_point deadline, std::string* reply, std::string* why) {
        if (!net::send_all(fd, f.data(), f.size(), deadline, why)) return false;
        char hdr[4];
        if (!net::recv_all(fd, hdr, 4, deadline, why)) return false;
        const std::uint32_t len = net::Reader(std::string_view(hdr, 4)).u32();
        if (len == 0 || len > net::kMaxFrame) {
            *why = fmt::format("malformed reply length {}", len);
            return false;
        }
        reply->resize(len);
        return net::recv_all(fd, reply->data(), len, deadline, why);
    }

    // The hello on a fresh connection. false: the server closed it unanswered (it sheds connections that have not
    // said hello when it is flooded) or did not answer in time; the caller retries. Raises when refused.
    bool hello(Clock::time_point deadline, std::string* why) {
        if (source == TokenSource::File) token = store_auth::derive_token(store_auth::read_token_file(port));
        std::string_view t(reinterpret_cast<const char*>(token.data()), token.size());
        std::string reply;
        if (!round_trip(frame(Op::Hello, net::Writer().bytes(t).i32(rank).i32(world)), deadline, &reply, why))
            return false;
        const auto status = static_cast<Status>(static_cast<std::uint8_t>(reply[0]));
        if (status == Status::Ok) return true;
        const std::string msg(net::Reader(std::string_view(reply).substr(1)).bytes());
        if (status == Status::Refused && msg == store_wire::kRankLeft) {
            // The store of an earlier World, draining (bounded by kMaxDrain), or this World's own, which this rank
            // joined and left before (a restarted rank): retried until the connect deadline, which then names both.
            *why = "the store of an earlier World answered (it is still draining)";
            rejoin_refused = fmt::format(
                "this rank already joined and left it (a restarted rank cannot rejoin a running World; an earlier "
                "World's store still draining was waited for until the connect timeout, {} ms)",
                timeout.count());
            return false;
        }
        if (status == Status::Refused && msg.find(store_wire::kAlreadyJoined) != std::string::npos) {
            // The previous World's store may not have seen this rank's last connection close yet: retried for
            // kRejoinGrace, then a second process with this rank is the likelier story.
            const auto now = Clock::now();
            if (rejoin_refused_since == Clock::time_point{}) rejoin_refused_since = now;
            if (now - rejoin_refused_since < kRejoinGrace) {
                *why = msg;
                rejoin_refused = msg;  // what the connect reports if its deadline passes first
                return false;
            }
        }
        if (status == Status::Refused && msg == store_wire::kWrongToken)
            LOOM_FAIL("rank {} was refused by the {}: wrong job token. {}", rank, where(),
                      source == TokenSource::File
                          ? fmt::format("This rank read rank 0's secret from {}, which belongs to another job: "
                                        "without LOOM_JOB_SECRET every rank must run on rank 0's host; otherwise "
                                        "export the same LOOM_JOB_SECRET to every rank",
                                        store_auth::token_file(port))
                          : std::string("Every rank must be given the same LOOM_JOB_SECRET (or Store secret)"));
        LOOM_FAIL("rank {} was refused by the {}: {}", rank, where(), msg);
    }

    void connect() {
        auto deadline = Clock::now() + timeout;
        auto backoff = std::chrono::milliseconds(10);
        std::string why;
        int attempts = 0;
        while (true) {
            ++attempts;
            fd = net::tcp_connect(addr, port, deadline, &why);
            if (fd >= 0) {
                if (hello(deadline, &why)) return;
                why = why == "closed" ? "the store closed the connection before answering the hello" : why;
                ::close(fd);
                fd = -1;
            }
            auto now = Clock::now();
            if (now >= deadline && !rejoin_refused.empty())
                LOOM_FAIL("rank {} was refused by the {}: {}", rank, where(), rejoin_refused);
            LOOM_CHECK(now < deadline,
                       "rank {} could not connect to the {} within {} ms ({} attempts, last error: {}); is rank 0 "
                       "running, and are LOOM_MASTER_ADDR/LOOM_MASTER_PORT (or MASTER_ADDR/MASTER_PORT + 1) right?",
                       rank, where(), timeout.count(), attempts, why);
            std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
            backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        }
    }

    // Sends one request and returns the reply payload after its status byte. `what` names the call in errors.
    std::string request(const std::string& what, Op op, const net::Writer& fields) {
        std::lock_guard<std::mutex> lock(mu);
        LOOM_CHECK(broken.empty(), "{} on rank {}: the store connection is unusable after an earlier error ({})", what,
                   rank, broken);
        std::string reply, why;
        if (!round_trip(frame(op, fields), Clock::now() + timeout + kClientGrace, &reply, &why)) {
            ::close(fd);
            fd = -1;
            if (why == "closed")
                broken = fmt::format("the {} closed the connection: rank 0 has exited or failed", where());
            else if (why == "timeout")
                broken = fmt::format("no reply from the {} within {} ms", where(), (timeout + kClientGrace).count());
            else
                broken = fmt::format("lost the connection to the {}: {}", where(), why);
            LOOM_FAIL("{} on rank {}: {}", what, rank, broken);
        }
        auto status = static_cast<Status>(static_cast<std::uint8_t>(reply[0]));
        if (status != Status::Ok) {
            net::Reader r(std::string_view(reply).substr(1));
            LOOM_FAIL("{} on rank {}: {}", what, rank, std::string(r.bytes()));
        }
        return reply.substr(1);
    }
};

Store::Store(int rank, int world_size, const std::string& addr, int port, std::chrono::milliseconds timeout,
             const std::string& secret)
    : impl_(std::make_unique<Impl>()) {
    LOOM_CHECK(world_size >= 1, "Store: expected a world size >= 1, given {}", world_size);
    LOOM_CHECK(rank >= 0 && rank < world_size, "Store: expected a rank in [0, {}), given {}", world_size, rank);
    LOOM_CHECK(port >= 0 && port <= 65535, "Store: expected a TCP port in [0, 65535], given {}", port);
    LOOM_CHECK(port != 0 || rank == 0, "Store: port 0 (pick a free port) is only meaningful on rank 0, given rank {}",
               rank);
    LOOM_CHECK(timeout.count() > 0 && timeout.count() <= 0xffffffffll,
               "Store: expected a timeout in (0, 2^32) ms, given {} ms", timeout.count());
    const std::string& job_secret = secret.empty() ? settings().job_secret : secret;
    LOOM_CHECK(job_secret.empty() || job_secret.size() >= store_auth::kMinSecretChars,
               "Store: expected a job secret of at least {} characters (secret or LOOM_JOB_SECRET), given {} "
               "characters",
               store_auth::kMinSecretChars, job_secret.size());
    auto& s = *impl_;
    s.rank = rank;
    s.world = world_size;
    s.addr = addr;
    s.port = port;
    s.timeout = timeout;
    std::string generated;
    if (!job_secret.empty()) {
        s.token = store_auth::derive_token(job_secret);
    } else if (rank == 0) {
        s.source = TokenSource::Generated;
        generated = store_auth::random_secret();
        s.token = store_auth::derive_token(generated);
    } else {
        s.source = TokenSource::File;
    }
    if (rank == 0) {
        s.server = std::make_unique<StoreServer>(addr, port, world_size, s.token);
        s.port = s.server->port();
        // Written between bind and listen: a rank that reaches this server finds this server's secret.
        if (s.source == TokenSource::Generated && world_size > 1) {
            s.wrote_token_file = true;
            store_auth::write_token_file(s.port, generated);
        }
        s.server->start();
    }
    std::lock_guard<std::mutex> lock(s.mu);
    s.connect();  // on failure the Impl (and rank 0's server) is destroyed with the half-built Store
}

Store::Store(const RankInfo& info)
    : Store(info.rank, info.world_size, info.master_addr, info.master_port, settings().store_timeout) {}

Store::~Store() = default;

int Store::rank() const { return impl_->rank; }
int Store::world_size() const { return impl_->world; }
int Store::port() const { return impl_->port; }
std::chrono::milliseconds Store::timeout() const { return impl_->timeout; }

namespace {

// A key as errors quote it: whole up to 100 characters.
std::string quoted(const std::string& key) {
    if (key.size() <= 100) return fmt::format("\"{}\"", key);
    return fmt::format("\"{}...\" ({} bytes)", key.substr(0, 100), key.size());
}

std::string call_name(const char* fn, const std::string& key) { return fmt::format("Store::{}({})", fn, quoted(key)); }

}  // namespace

void Store::set(const std::string& key, const Bytes& value) {
    const std::string what = call_name("set", key);
    check_key(what, key);
    check_value(what, value.size());
    std::string_view v(reinterpret_cast<const char*>(value.data()), value.size());
    impl_->request(what, Op::Set, net::Writer().bytes(key).bytes(v));
}

void Store::set(const std::string& key, const std::string& value) {
    const std::string what = call_name("set", key);
    check_key(what, key);
    check_value(what, value.size());
    impl_->request(what, Op::Set, net::Writer().bytes(key).bytes(value));
}

std::string Store::get_string(const std::string& key) {
    const std::string what = call_name("get", key);
    check_key(what, key);
    std::string reply = impl_->request(what, Op::Get, net::Writer().bytes(key));
    return std::string(net::Reader(reply).bytes());
}

Bytes Store::get(const std::string& key) {
    std::string v = get_string(key);
    return Bytes(v.begin(), v.end());
}

bool Store::check(const std::string& key) {
    const std::string what = call_name("check", key);
    check_key(what, key);
    std::string reply = impl_->request(what, Op::Check, net::Writer().bytes(key));
    return net::Reader(reply).u8() != 0;
}

void Store::wait(const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    const std::string what = fmt::format("Store::wait({} keys, first {})", keys.size(), quoted(keys[0]));
    std::size_t bytes = 0;
    for (auto& k : keys) {
        check_key(what, k);
        bytes += 4 + k.size();
    }
    LOOM_CHECK(bytes <= kMaxKeyBytes + kMaxValueBytes, "{}: {} bytes of keys; expected at most {} bytes in one wait",
               what, bytes, kMaxKeyBytes + kMaxValueBytes);
    net::Writer w;
    w.u32(static_cast<std::uint32_t>(keys.size()));
    for (auto& k : keys) w.bytes(k);
    impl_->request(what, Op::Wait, w);
}

std::int64_t Store::add(const std::string& key, std::int64_t delta) {
    const std::string what = fmt::format("Store::add({}, {})", quoted(key), delta);
    check_key(what, key);
    std::string reply = impl_->request(what, Op::Add, net::Writer().bytes(key).i64(delta));
    return net::Reader(reply).i64();
}

void Store::barrier(const std::string& tag) {
    const std::string key = fmt::format("barrier/{}/", tag);
    check_key(fmt::format("Store::barrier({})", quoted(tag)), key + "18446744073709551615");
    std::uint64_t call;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        call = ++impl_->barrier_calls[tag];
    }
    impl_->request(fmt::format("Store::barrier({}) call #{}", quoted(tag), call), Op::Gather,
                   net::Writer().bytes(key + std::to_string(call)).i32(impl_->rank).i32(impl_->world).bytes(""));
}

std::vector<Bytes> Store::all_gather(const std::string& tag, const Bytes& mine) {
    const std::string key = fmt::format("all_gather/{}/", tag);
    const std::string what = fmt::format("Store::all_gather({})", quoted(tag));
    check_key(what, key + "18446744073709551615");
    check_value(what, mine.size());
    std::uint64_t call;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        call = ++impl_->gather_calls[tag];
    }
    std::string_view v(reinterpret_cast<const char*>(mine.data()), mine.size());
    std::string reply =
        impl_->request(fmt::format("{} call #{}", what, call), Op::Gather,
                       net::Writer().bytes(key + std::to_string(call)).i32(impl_->rank).i32(impl_->world).bytes(v));
    net::Reader r(reply);
    std::uint32_t n = r.u32();
    LOOM_CHECK(static_cast<int>(n) == impl_->world, "Store::all_gather(\"{}\"): expected {} values, given {}", tag,
               impl_->world, n);
    std::vector<Bytes> out(n);
    for (auto& b : out) {
        auto s = r.bytes();
        b.assign(s.begin(), s.end());
    }
    return out;
}

}  // namespace loom
