// Private: the bootstrap store's server, hosted by rank 0's Store in a background thread.
//
// One poll() loop serves every client (non-blocking sockets, per-connection buffers), so a slow or dead
// client never stalls the others. Requests that wait (get, wait, barrier/all-gather arrivals) are parked
// and answered when their keys appear or all ranks arrive, or with an error naming what is missing when
// the timeout carried by the request expires.
//
// Admission (store_auth.hpp): a connection's first frame must be a hello of at most kMaxHelloFrame bytes carrying
// the job token; anything else first closes the connection without a reply, so a stranger can neither read nor
// write keys. A hello with a wrong token, a rank outside [0, world), a rank that has already joined or another
// world size is answered with an error and closed. After its hello a connection is that rank: requests that name
// a rank (barrier, all-gather) must name it.
//
// Bounds (StoreLimits): key and value sizes; bytes held (keys, values, pending all-gather contributions);
// connections (world size + spare_connections); per connection one request in progress at a time, later
// pipelined frames staying in the socket once one frame's worth is buffered, and the next request handled only
// once earlier replies have drained; time for the hello, for a started frame to complete and for a pending reply
// to make progress. When the connection limit or the descriptor limit (EMFILE, ENFILE) is reached, the oldest
// connection that has not said hello (preferring one that has sent nothing) is closed to make room; with none to
// close, the incoming connection is refused and accept() pauses for 100 ms. An exception while serving one
// connection closes that connection only; each kind of drop is logged once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "loom/runtime/store.hpp"
#include "runtime/store_auth.hpp"

namespace loom::store_wire {

enum class Op : std::uint8_t { Hello = 1, Set, Get, Check, Wait, Add, Gather };
// Refused: the hello was not accepted (wrong token, rank or world size); the server closes the connection.
enum class Status : std::uint8_t { Ok = 0, Error = 1, Refused = 2 };

// The refusal text of a hello with a wrong token (the client adds what to check).
inline constexpr const char* kWrongToken = "wrong job token";
// The refusal of a hello from a rank that joined this store and has closed its connection since: this is the store of
// an earlier World, draining, and the rank is starting the next one (the client retries until the new store answers).
inline constexpr const char* kRankLeft = "this rank left this store";
// Part of the refusal of a hello from a rank whose connection is still open: two processes given one rank, or a rank
// starting its next World before this store noticed its last connection close (the client retries for a while).
inline constexpr const char* kAlreadyJoined = "has already joined the store";

// Largest first frame: [u8 op][u32 timeout][u32 32][token][i32 rank][i32 world] is 53 bytes.
inline constexpr std::uint32_t kMaxHelloFrame = 128;

}  // namespace loom::store_wire

namespace loom {

struct StoreLimits {
    std::size_t max_key = Store::kMaxKeyBytes;
    std::size_t max_value = Store::kMaxValueBytes;
    std::size_t max_stored = std::size_t{256} << 20;  // keys + values held, and pending all-gather contributions
    int spare_connections = 32;                       // connections allowed beyond one per rank
    std::chrono::milliseconds hello_timeout{10000};   // from accept to a complete hello
    std::chrono::milliseconds frame_timeout{30000};   // a started frame completes; a pending reply progresses
};

// Counters since the server started; the peaks bound its memory (tests assert on them).
struct StoreServerStats {
    std::uint64_t accepted = 0;      // connections accepted
    std::uint64_t joined = 0;        // hellos accepted
    std::uint64_t refused = 0;       // hellos refused (token, rank, world size)
    std::uint64_t dropped = 0;       // closed for a protocol violation, a timeout or an error while serving
    std::uint64_t shed = 0;          // closed or refused to make room (connection or descriptor limit)
    std::uint64_t fd_exhausted = 0;  // accept() failures for want of descriptors
    std::uint64_t polls = 0;         // loop iterations
    std::size_t peak_buffered = 0;   // most bytes held in connection buffers at once
    std::size_t peak_stored = 0;     // most bytes of keys, values and pending contributions at once
};

class StoreServer {
  public:
    // Binds (addr, port) now, so a busy port raises in the constructor; start() listens and serves in a thread.
    // Clients must present `token` in their hello.
    StoreServer(const std::string& addr, int port, int world_size, const store_auth::Token& token,
                const StoreLimits& limits = {});
    ~StoreServer();  // stop(0)
    StoreServer(const StoreServer&) = delete;
    StoreServer& operator=(const StoreServer&) = delete;

    int port() const { return port_; }
    void start();
    StoreServerStats stats() const;

    // Stops serving once every rank that joined has disconnected or `drain` has passed, whichever is first, so that
    // ranks still finishing their last requests are not cut off by rank 0 leaving early (connections that never
    // said hello do not hold it up). Idempotent.
    void stop(std::chrono::milliseconds drain);

    struct StatsBox {
        mutable std::mutex mu;
        StoreServerStats s;
    };

  private:
    void serve();

    std::string addr_;
    int world_size_;
    store_auth::Token token_;
    StoreLimits limits_;
    int listen_fd_ = -1;
    int port_ = 0;
    int wake_[2] = {-1, -1};  // self-pipe: stop() wakes poll()
    std::atomic<bool> stopping_{false};
    std::atomic<std::int64_t> drain_until_ns_{0};
    StatsBox stats_;
    std::thread thread_;
};

}  // namespace loom
