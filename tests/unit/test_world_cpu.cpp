// loom::World without a symmetric heap (create_heap = false, bind_device = false), over the real store, with
// one forked process per rank: rank facts, barriers, the Ctx, collective agreement of heap calls, shutdown
// (idempotent, bounded when a peer has died), move-only ownership, and the bootstrap under torchrun's variables
// beside a listener on MASTER_PORT.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/world.hpp"
#include "runtime/settings_override.hpp"
#include "unit/forked.hpp"

namespace {

using namespace std::chrono_literals;
using loom::test::run_children;

constexpr loom::WorldOptions kCpuOnly{.create_heap = false, .bind_device = false};

// Ranks of one simulated job: rank 0's World picks a free port and tells the others through a pipe.
class Job {
  public:
    Job(int world, int local_world) : world_(world), local_world_(local_world) {
        if (::pipe(fds_) != 0) std::abort();
    }
    ~Job() {
        ::close(fds_[0]);
        ::close(fds_[1]);
    }

    // In the child of `rank`: builds its World (rank 0 first, then the others once they know the port).
    loom::World make(int rank) {
        loom::RankInfo info;
        info.rank = rank;
        info.world_size = world_;
        info.local_world_size = local_world_;
        info.local_rank = rank % local_world_;
        info.node = rank / local_world_;
        info.master_addr = "127.0.0.1";
        info.source = "test";
        if (rank == 0) {
            info.master_port = 0;
            loom::World w(info, kCpuOnly);
            int port = w.store().port();
            for (int i = 1; i < world_; ++i)
                if (::write(fds_[1], &port, sizeof port) != sizeof port) std::abort();
            return w;
        }
        int port = 0;
        if (::read(fds_[0], &port, sizeof port) != sizeof port) std::abort();
        info.master_port = port;
        return loom::World(info, kCpuOnly);
    }

  private:
    int world_, local_world_;
    int fds_[2];
};

// A failed check in a child: print it and turn it into the exit status.
#define CHILD_CHECK(cond)                                                                      \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            std::fprintf(stderr, "%s:%d: rank check failed: %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

bool contains(const std::string& s, const std::string& part) {
    if (s.find(part) != std::string::npos) return true;
    std::fprintf(stderr, "expected \"%s\" in: %s\n", part.c_str(), s.c_str());
    return false;
}

void expect_all_zero(const std::vector<int>& status) {
    for (std::size_t i = 0; i < status.size(); ++i) EXPECT_EQ(status[i], 0) << "rank " << i;
}

TEST(WorldCpu, RankFactsBarrierAndCtx) {
    for (auto [world, local] : {std::pair{1, 1}, {3, 3}, {4, 2}}) {
        Job job(world, local);
        expect_all_zero(run_children(world, [&](int rank) {
            loom::World w = job.make(rank);
            CHILD_CHECK(w.rank() == rank && w.world_size() == world);
            CHILD_CHECK(w.local_rank() == rank % local && w.local_world_size() == local);
            CHILD_CHECK(w.node() == rank / local && w.device() == -1);
            for (int i = 0; i < 5; ++i) w.barrier("loop");
            w.barrier();
            loom::Ctx c = w.ctx();
            CHILD_CHECK(c.rank == rank && c.world == world && c.local_rank == rank % local);
            CHILD_CHECK(c.local_world == local && c.node == rank / local);
            CHILD_CHECK(c.local_base_rank == (rank / local) * local);
            CHILD_CHECK(c.heap_size == 0 && c.heap[0] == nullptr);
            CHILD_CHECK(c.reachable(c.local_base_rank) && !c.reachable(c.local_base_rank + local));
            // The store is usable by callers, and collectives over it line up across ranks.
            auto all = w.store().all_gather("ranks", loom::Bytes{static_cast<std::uint8_t>(rank)});
            for (int r = 0; r < world; ++r) CHILD_CHECK(all[r] == loom::Bytes{static_cast<std::uint8_t>(r)});
            w.shutdown();
            w.shutdown();  // idempotent
            CHILD_CHECK(w.is_shut_down());
            try {
                w.barrier();
                return 2;
            } catch (const loom::Error& e) {
                CHILD_CHECK(contains(e.what(), "after shutdown"));
            }
            return 0;
        }));
    }
}

TEST(WorldCpu, WaitTimeoutReachesTheCtx) {
    Job job(2, 2);
    expect_all_zero(run_children(2, [&](int rank) {
        const loom::detail::ScopedSettings bound([](loom::Settings& s) { s.wait_timeout = 1500ms; });
        loom::World w = job.make(rank);
        CHILD_CHECK(w.ctx().wait_timeout_ns == 1500ull * 1000000ull);
        return 0;
    }));
}

// The collectives' scratch is a World option: 64 MiB by default, kept by the World, and below 1 MiB refused by name.
TEST(WorldCpu, CollScratchIsAnOptionWithAFloor) {
    EXPECT_EQ(loom::WorldOptions{}.coll_scratch, std::size_t{64} << 20);
    loom::RankInfo one;
    one.master_addr = "127.0.0.1";
    one.master_port = 0;
    loom::WorldOptions o = kCpuOnly;
    o.coll_scratch = std::size_t{2} << 20;
    EXPECT_EQ(loom::World(one, o).coll_scratch(), std::size_t{2} << 20);
    o.coll_scratch = std::size_t{1} << 19;
    try {
        loom::World w(one, o);
        ADD_FAILURE() << "accepted a collective scratch of 512 KiB";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("WorldOptions::coll_scratch"), std::string::npos) << e.what();
    }
}

TEST(WorldCpu, DisagreeingAllocationRaisesOnEveryRank) {
    Job job(3, 3);
    expect_all_zero(run_children(3, [&](int rank) {
        loom::World w = job.make(rank);
        try {
            w.alloc_bytes(4096 * (rank == 1 ? 1 : 2));
            return 2;
        } catch (const loom::Error& e) {
            CHILD_CHECK(contains(e.what(), "rank 0 asked 8192 bytes"));
            CHILD_CHECK(contains(e.what(), "rank 1 asked 4096 bytes"));
            CHILD_CHECK(contains(e.what(), "rank 2 asked 8192 bytes"));
        }
        try {  // every rank agrees, then every rank finds there is no heap
            w.alloc<float>(10);
            return 3;
        } catch (const loom::Error& e) {
            CHILD_CHECK(contains(e.what(), "no symmetric heap"));
        }
        try {
            w.alloc_bytes(64, rank == 2 ? 512 : 256);
            return 4;
        } catch (const loom::Error& e) {
            CHILD_CHECK(contains(e.what(), "rank 2 asked 64 bytes (alignment 512)"));
        }
        try {  // an alloc on some ranks and a free on others
            if (rank == 0) {
                int x;
                w.free(&x);
            } else {
                w.alloc_bytes(128);
            }
            return 5;
        } catch (const loom::Error& e) {
            CHILD_CHECK(contains(e.what(), "which is not in the symmetric heap"));
            CHILD_CHECK(contains(e.what(), "rank 1 asked 128 bytes"));
        }
        try {  // everyone frees a foreign pointer
            int x;
            w.free(&x);
            return 6;
        } catch (const loom::Error& e) {
            CHILD_CHECK(contains(e.what(), "not in the symmetric heap"));
        }
        CHILD_CHECK(!w.is_symmetric(&job));
        try {
            w.peer_ptr(&job, 0);
            return 7;
        } catch (const loom::Error& e) {
            CHILD_CHECK(contains(e.what(), "no symmetric heap"));
        }
        w.barrier("after");  // the collectives stayed in step across all those errors
        return 0;
    }));
}

TEST(WorldCpu, ShutdownIsBoundedWhenAPeerDied) {
    // Rank 1 dies without shutting down: rank 0 (the store host) warns and returns within the bound.
    Job job(2, 2);
    auto status = run_children(2, [&](int rank) {
        const loom::detail::ScopedSettings bound([](loom::Settings& s) { s.shutdown_timeout = 500ms; });
        loom::World w = job.make(rank);
        w.barrier("up");
        if (rank == 1) ::_exit(0);
        auto t0 = std::chrono::steady_clock::now();
        w.shutdown();
        CHILD_CHECK(std::chrono::steady_clock::now() - t0 < 10s);
        return 0;
    });
    expect_all_zero(status);
    // Rank 0 dies: rank 1 finds the store gone and still returns promptly.
    Job job2(2, 2);
    status = run_children(2, [&](int rank) {
        const loom::detail::ScopedSettings bound([](loom::Settings& s) { s.shutdown_timeout = 3000ms; });
        loom::World w = job2.make(rank);
        w.barrier("up");
        if (rank == 0) {
            // Die only once rank 1 is past the barrier (its reply may still be in flight otherwise).
            while (w.store().add("rank1-up", 0) == 0) std::this_thread::sleep_for(1ms);
            ::_exit(0);
        }
        w.store().add("rank1-up", 1);
        std::this_thread::sleep_for(100ms);
        auto t0 = std::chrono::steady_clock::now();
        w.shutdown();
        CHILD_CHECK(std::chrono::steady_clock::now() - t0 < 10s);
        return 0;
    });
    expect_all_zero(status);
}

TEST(WorldCpu, MovedWorldKeepsWorking) {
    Job job(2, 2);
    expect_all_zero(run_children(2, [&](int rank) {
        loom::World a = job.make(rank);
        loom::World b = std::move(a);
        b.barrier("moved");
        CHILD_CHECK(b.rank() == rank);
        try {
            a.rank();  // NOLINT(bugprone-use-after-move): the moved-from World must raise, not crash
            return 2;
        } catch (const loom::Error& e) {
            CHILD_CHECK(contains(e.what(), "moved from"));
        }
        CHILD_CHECK(a.is_shut_down());
        return 0;
    }));
}

// A listening loopback socket on `port` (0: a free one), as torch.distributed's store holds MASTER_PORT; -1 when
// the port is taken.
int listen_on(int port, int* bound) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(static_cast<std::uint16_t>(port));
    socklen_t len = sizeof(sa);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(fd, 16) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
        if (fd >= 0) ::close(fd);
        return -1;
    }
    *bound = ntohs(sa.sin_port);
    return fd;
}

// torchrun's store: a listener on MASTER_PORT, chosen so that MASTER_PORT + 1 is free now.
struct TorchStore {
    int fd = -1, port = 0;
    TorchStore() {
        for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
            fd = listen_on(0, &port);
            int next = 0, probe = port < 65535 ? listen_on(port + 1, &next) : -1;
            if (probe >= 0) {
                ::close(probe);
            } else if (fd >= 0) {
                ::close(fd);
                fd = -1;
            }
        }
    }
    ~TorchStore() {
        if (fd >= 0) ::close(fd);
    }
};

loom::RankInfo torchrun_rank(int rank, int world, int master_port, const std::string& loom_port = "") {
    std::map<std::string, std::string> vars{
        {"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
        {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(master_port)},
        {"LOOM_MASTER_PORT", loom_port}};
    return loom::rank_info_from_env([vars](const std::string& name) -> std::optional<std::string> {
        auto it = vars.find(name);
        return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    });
}

// torchrun --nproc-per-node 3 with no Loom variable: the World's store comes up on MASTER_PORT + 1 while torchrun's
// store holds MASTER_PORT, and torchrun's listener is left alone.
TEST(WorldCpu, ComesUpUnderTorchrunBesideItsStore) {
    TorchStore torch;
    ASSERT_GE(torch.fd, 0) << "no free port pair on loopback";
    constexpr int kWorld = 3;
    expect_all_zero(run_children(kWorld, [&](int rank) {
        const loom::RankInfo info = torchrun_rank(rank, kWorld, torch.port);
        CHILD_CHECK(info.source == "torchrun" && info.rank == rank && info.world_size == kWorld);
        CHILD_CHECK(info.master_port == torch.port + 1);
        loom::World w(info, kCpuOnly);
        CHILD_CHECK(w.store().port() == torch.port + 1);
        const std::uint64_t mine = 0x9e3779b97f4a7c15ull * (rank + 1) ^ static_cast<std::uint64_t>(::getpid());
        loom::Bytes bytes(reinterpret_cast<const std::uint8_t*>(&mine),
                          reinterpret_cast<const std::uint8_t*>(&mine + 1));
        auto all = w.store().all_gather("torchrun", bytes);
        CHILD_CHECK(static_cast<int>(all.size()) == kWorld && all[rank] == bytes);
        w.barrier("torchrun");
        w.shutdown();
        return 0;
    }));
    int next = 0, again = listen_on(torch.port, &next);
    EXPECT_LT(again, 0) << "torchrun's listener on MASTER_PORT " << torch.port << " is still there";
    if (again >= 0) ::close(again);
}

// Worlds made one after another on one store port (as a job does with a fixed MASTER_PORT): a rank that starts its next
// World while rank 0 still serves the last one's store retries until the new store answers.
TEST(WorldCpu, WorldsOneAfterAnotherOnOnePort) {
    int port = 0;
    const int probe = listen_on(0, &port);
    ASSERT_GE(probe, 0) << "no free port on loopback";
    ::close(probe);
    for (int world : {2, 4}) {
        expect_all_zero(run_children(world, [&](int rank) {
            loom::RankInfo info;
            info.rank = rank;
            info.world_size = info.local_world_size = world;
            info.local_rank = rank;
            info.master_addr = "127.0.0.1";
            info.master_port = port;
            info.source = "test";
            for (int i = 0; i < 5; ++i) {
                loom::World w(info, kCpuOnly);
                w.barrier("next");
                CHILD_CHECK(w.rank() == rank && w.store().port() == port);
            }
            return 0;
        }));
    }
}

// When MASTER_PORT + 1 is taken too, rank 0 fails at once naming the port and the variable that moves it; with
// LOOM_MASTER_PORT set the same job comes up.
TEST(WorldCpu, BusyStorePortNamesTheVariableToSet) {
    TorchStore torch;
    ASSERT_GE(torch.fd, 0) << "no free port pair on loopback";
    int next = 0, squatter = listen_on(torch.port + 1, &next);
    ASSERT_GE(squatter, 0);
    expect_all_zero(run_children(1, [&](int) {
        try {
            loom::World w(torchrun_rank(0, 1, torch.port), kCpuOnly);
            return 2;
        } catch (const loom::Error& e) {
            CHILD_CHECK(contains(e.what(), "127.0.0.1:" + std::to_string(torch.port + 1) + " is in use"));
            CHILD_CHECK(contains(e.what(), "set LOOM_MASTER_PORT to a free port"));
            CHILD_CHECK(contains(e.what(), "MASTER_PORT + 1"));
        }
        loom::World w(torchrun_rank(0, 1, torch.port, "0"), kCpuOnly);  // 0: rank 0 picks a free port
        CHILD_CHECK(w.store().port() != torch.port && w.store().port() != torch.port + 1);
        w.barrier("solo");
        return 0;
    }));
    ::close(squatter);
}

TEST(WorldCpu, HeapWithoutGpuSaysSo) {
    if (loom::driver::available()) GTEST_SKIP() << "a GPU is present";
    loom::RankInfo info;
    try {
        loom::World w(info, loom::WorldOptions{});
        FAIL() << "creating a heap without a GPU did not raise";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("no GPU: "), std::string::npos) << e.what();
    }
}

}  // namespace
