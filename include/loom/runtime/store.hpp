// Bootstrap key-value store over TCP, hosted by rank 0.
//
// Contract: every operation is bounded by the store timeout (LOOM_STORE_TIMEOUT_MS, default 300 s) and
// raises loom::Error naming the key (and, for barriers and all-gathers, the ranks that never arrived)
// when it expires. Clients retry the connection until the timeout (rank 0 may start last). When rank 0's
// server goes away, pending and later operations raise instead of hanging; after any error the Store is
// unusable (its connection may be out of step) and every later call raises, except a key or value over the
// size limits, which raises before anything is sent.
//
// Admission: only the job's ranks may use the store. Each connection starts with a hello carrying a token derived
// from the job secret (`secret`, else LOOM_JOB_SECRET, which loomrun sets; without either, rank 0 leaves a random
// secret in a file only this user can read, which works when every rank runs on rank 0's host); the server
// closes any connection that sends something else first, and accepts each rank once. Rank 0 listens on exactly
// the given address (0.0.0.0, every interface, only when given). docs/reliability.md has the security model.
//
// Threads: one Store may be shared by threads; calls are serialised on its one connection, so a get() that
// waits blocks the others until it returns.
//
// Wire protocol (rank 0's server, loopback or TCP/IPv4): frames of [u32 length][body], little-endian;
// request body = [u8 op][u32 timeout ms][fields], reply body = [u8 status][payload or error text]. The
// server applies each waiting request's timeout itself, so it can say which keys or ranks were missing.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/runtime/env.hpp"

namespace loom {

using Bytes = std::vector<std::uint8_t>;

class Store {
  public:
    // Limits on what one key and one value (or one rank's all-gather contribution) may hold, as PyTorch's TCPStore.
    static constexpr std::size_t kMaxKeyBytes = std::size_t{8} << 10;
    static constexpr std::size_t kMaxValueBytes = std::size_t{8} << 20;

    // rank 0 listens on (addr, port) and serves; every rank (0 included) is a client of that server.
    // port 0 on rank 0 picks a free port (see port()); useful for tests. `secret`: the job secret, the same on
    // every rank (at least 16 characters); empty: LOOM_JOB_SECRET, else rank 0's token file (see above).
    Store(int rank, int world_size, const std::string& addr, int port, std::chrono::milliseconds timeout,
          const std::string& secret = {});
    // From the rank facts, with LOOM_STORE_TIMEOUT_MS and LOOM_JOB_SECRET.
    explicit Store(const RankInfo& info);
    ~Store();
    Store(const Store&) = delete;
    Store& operator=(const Store&) = delete;

    int rank() const;
    int world_size() const;
    int port() const;  // the port actually bound / connected
    std::chrono::milliseconds timeout() const;

    void set(const std::string& key, const Bytes& value);
    Bytes get(const std::string& key);   // waits until the key exists
    bool check(const std::string& key);  // exists now? never waits
    void wait(const std::vector<std::string>& keys);
    std::int64_t add(const std::string& key, std::int64_t delta);  // atomic; returns the new value

    // Every rank calls with the same tag sequence (each Store counts its calls per tag, so a tag may be reused).
    // Raises naming the missing ranks on timeout. all_gather returns the values in rank order.
    void barrier(const std::string& tag = "");
    std::vector<Bytes> all_gather(const std::string& tag, const Bytes& mine);

    // String conveniences.
    void set(const std::string& key, const std::string& value);
    std::string get_string(const std::string& key);

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace loom
