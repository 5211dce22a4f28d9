// Bootstrap store client; rank 0 also owns the server (store_server.cpp).
#include "loom/runtime/store.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
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
}  // namespace

struct Store::Impl {
    int rank, world;
    std::string addr;
    int port;
    std::chrono::milliseconds timeout;
    std::unique_ptr<StoreServer> server;  // rank 0 only

    std::mutex mu;  // serialises requests on the one connection, and guards the fields below
    int fd = -1;
    std::string broken;  // why the connection is unusable; empty while it is fine
    std::map<std::string, std::uint64_t> barrier_calls, gather_calls;

    // Also runs when a constructor throws half-way, so a failed connect leaves no socket behind.
    ~Impl() {
        if (fd >= 0) ::close(fd);
        if (server) server->stop(std::min(timeout, kMaxDrain));
    }

    std::string where() const { return fmt::format("store at {}:{}", addr, port); }

    void connect() {
        auto deadline = Clock::now() + timeout;
        auto backoff = std::chrono::milliseconds(10);
        std::string why;
        int attempts = 0;
        while (true) {
            ++attempts;
            fd = net::tcp_connect(addr, port, deadline, &why);
            if (fd >= 0) break;
            auto now = Clock::now();
            LOOM_CHECK(now < deadline,
                       "rank {} could not connect to the {} within {} ms ({} attempts, last error: {}); is rank 0 "
                       "running, and are LOOM_MASTER_ADDR/LOOM_MASTER_PORT (or MASTER_ADDR/MASTER_PORT + 1) right?",
                       rank, where(), timeout.count(), attempts, why);
            std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
            backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        }
        request(fmt::format("connecting rank {}", rank), Op::Hello, net::Writer().i32(rank).i32(world), true);
    }

    // Sends one request and returns the reply payload after its status byte. `what` names the call in errors.
    std::string request(const std::string& what, Op op, const net::Writer& fields, bool locked = false) {
        std::unique_lock<std::mutex> lock(mu, std::defer_lock);
        if (!locked) lock.lock();
        LOOM_CHECK(broken.empty(), "{} on rank {}: the store connection is unusable after an earlier error ({})", what,
                   rank, broken);
        net::Writer body;
        body.u8(static_cast<std::uint8_t>(op)).u32(static_cast<std::uint32_t>(timeout.count()));
        std::string frame = body.frame() + fields.data();
        // Patch the length: the header covers op + timeout + fields.
        std::uint32_t len = static_cast<std::uint32_t>(frame.size() - 4);
        for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((len >> (8 * i)) & 0xff);

        auto deadline = Clock::now() + timeout + kClientGrace;
        std::string why;
        std::uint32_t reply_len = 0;
        std::string reply;
        bool ok = net::send_all(fd, frame.data(), frame.size(), deadline, &why);
        if (ok) {
            char hdr[4];
            ok = net::recv_all(fd, hdr, 4, deadline, &why);
            if (ok) {
                reply_len = net::Reader(std::string_view(hdr, 4)).u32();
                if (reply_len == 0 || reply_len > net::kMaxFrame) {
                    ok = false;
                    why = fmt::format("malformed reply length {}", reply_len);
                }
            }
            if (ok) {
                reply.resize(reply_len);
                ok = net::recv_all(fd, reply.data(), reply_len, deadline, &why);
            }
        }
        if (!ok) {
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

Store::Store(int rank, int world_size, const std::string& addr, int port, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
    LOOM_CHECK(world_size >= 1, "Store: expected a world size >= 1, given {}", world_size);
    LOOM_CHECK(rank >= 0 && rank < world_size, "Store: expected a rank in [0, {}), given {}", world_size, rank);
    LOOM_CHECK(port >= 0 && port <= 65535, "Store: expected a TCP port in [0, 65535], given {}", port);
    LOOM_CHECK(port != 0 || rank == 0, "Store: port 0 (pick a free port) is only meaningful on rank 0, given rank {}",
               rank);
    LOOM_CHECK(timeout.count() > 0 && timeout.count() <= 0xffffffffll,
               "Store: expected a timeout in (0, 2^32) ms, given {} ms", timeout.count());
    auto& s = *impl_;
    s.rank = rank;
    s.world = world_size;
    s.addr = addr;
    s.port = port;
    s.timeout = timeout;
    if (rank == 0) {
        s.server = std::make_unique<StoreServer>(addr, port, world_size);
        s.port = s.server->port();
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

void Store::set(const std::string& key, const Bytes& value) {
    std::string_view v(reinterpret_cast<const char*>(value.data()), value.size());
    impl_->request(fmt::format("Store::set(\"{}\")", key), Op::Set, net::Writer().bytes(key).bytes(v));
}

void Store::set(const std::string& key, const std::string& value) {
    impl_->request(fmt::format("Store::set(\"{}\")", key), Op::Set, net::Writer().bytes(key).bytes(value));
}

std::string Store::get_string(const std::string& key) {
    std::string reply = impl_->request(fmt::format("Store::get(\"{}\")", key), Op::Get, net::Writer().bytes(key));
    return std::string(net::Reader(reply).bytes());
}

Bytes Store::get(const std::string& key) {
    std::string v = get_string(key);
    return Bytes(v.begin(), v.end());
}

bool Store::check(const std::string& key) {
    std::string reply = impl_->request(fmt::format("Store::check(\"{}\")", key), Op::Check, net::Writer().bytes(key));
    return net::Reader(reply).u8() != 0;
}

void Store::wait(const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    net::Writer w;
    w.u32(static_cast<std::uint32_t>(keys.size()));
    for (auto& k : keys) w.bytes(k);
    impl_->request(fmt::format("Store::wait({} keys, first \"{}\")", keys.size(), keys[0]), Op::Wait, w);
}

std::int64_t Store::add(const std::string& key, std::int64_t delta) {
    std::string reply =
        impl_->request(fmt::format("Store::add(\"{}\", {})", key, delta), Op::Add, net::Writer().bytes(key).i64(delta));
    return net::Reader(reply).i64();
}

void Store::barrier(const std::string& tag) {
    std::uint64_t call;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        call = ++impl_->barrier_calls[tag];
    }
    impl_->request(
        fmt::format("Store::barrier(\"{}\") call #{}", tag, call), Op::Gather,
        net::Writer().bytes(fmt::format("barrier/{}/{}", tag, call)).i32(impl_->rank).i32(impl_->world).bytes(""));
}

std::vector<Bytes> Store::all_gather(const std::string& tag, const Bytes& mine) {
    std::uint64_t call;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        call = ++impl_->gather_calls[tag];
    }
    std::string_view v(reinterpret_cast<const char*>(mine.data()), mine.size());
    std::string reply = impl_->request(
        fmt::format("Store::all_gather(\"{}\") call #{}", tag, call), Op::Gather,
        net::Writer().bytes(fmt::format("all_gather/{}/{}", tag, call)).i32(impl_->rank).i32(impl_->world).bytes(v));
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
