#include "loom/runtime/world.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <typeindex>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"
#include "loom/runtime/settings.hpp"
#include "runtime/diag_mailbox.hpp"
#include "runtime/heap_allocator.hpp"
#include "runtime/log.hpp"
#include "runtime/node_layout.hpp"
#include "runtime/pointer_check.hpp"
#include "runtime/profile_ring.hpp"

namespace loom {
namespace {

// One collective heap call as every rank reports it, so all ranks can check they made the same call.
struct HeapCall {
    enum Op : std::uint32_t { Alloc = 1, Free = 2 };
    enum FreeStatus : std::uint32_t { Live = 0, NotInHeap = 1, NotAnAllocation = 2 };
    std::uint32_t op;
    std::uint32_t status;  // Free only
    std::uint64_t a;       // Alloc: bytes; Free: offset (or the address when NotInHeap)
    std::uint64_t b;       // Alloc: alignment
    bool operator==(const HeapCall&) const = default;
};

std::string describe(const HeapCall& c) {
    if (c.op == HeapCall::Alloc) return fmt::format("asked {} bytes (alignment {})", c.a, c.b);
    switch (c.status) {
        case HeapCall::Live:
            return fmt::format("freed offset {}", c.a);
        case HeapCall::NotInHeap:
            return fmt::format("freed {:#x}, which is not in the symmetric heap", c.a);
        default:
            return fmt::format("freed offset {}, which is not a pointer returned by alloc", c.a);
    }
}

void check_coll_scratch(std::size_t bytes) {
    LOOM_CHECK(bytes >= (std::size_t{1} << 20), "WorldOptions::coll_scratch: expected at least 1 MiB, given {} bytes",
               bytes);
}

}  // namespace

struct World::Impl {
    RankInfo info;
    std::unique_ptr<Store> store;
    int device = -1;
    std::size_t coll_scratch = 0;
    std::unique_ptr<SymmetricHeap> heap;
    std::unique_ptr<detail::HeapAllocator> allocator;
    char* remote_heap = nullptr;    // the heap registered with NVSHMEM (a World of several nodes), else null
    bool local_registered = false;  // the heap's own address registered with NVSHMEM's network transports
    std::uint64_t wait_timeout_ns = 0;
    DiagMailbox* diag = nullptr;  // device address of the process's diagnostic mailbox (runtime/diag_mailbox.hpp)
    bool shut_down = false;
    bool barrier_at_shutdown = true;
    // The extension slot (World::state): op states by key, in creation order for destruction.
    struct StateEntry {
        std::type_index type;
        std::unique_ptr<WorldState> state;
        std::uint64_t order;
    };
    std::mutex states_mu;
    std::map<std::string, StateEntry, std::less<>> states;
    std::uint64_t states_created = 0;

    // Destroys every state, newest first (local resources only: the heap goes next and takes their symmetric memory).
    void destroy_states() noexcept {
        std::vector<StateEntry*> order;
        for (auto& [key, e] : states) order.push_back(&e);
        std::sort(order.begin(), order.end(),
                  [](const StateEntry* a, const StateEntry* b) { return a->order > b->order; });
        for (StateEntry* e : order) e->state.reset();
        states.clear();
    }

    ~Impl() { shutdown(); }

    // All ranks gather their call and check they agree; raises the same error on every rank otherwise.
    void agree(const HeapCall& mine, const char* what) {
        Bytes b(sizeof mine);
        std::memcpy(b.data(), &mine, sizeof mine);
        std::vector<HeapCall> all;
        for (const auto& r : store->all_gather("loom/heap-call", b)) {
            LOOM_CHECK(r.size() == sizeof(HeapCall), "{}: expected {} bytes from a peer, given {}", what,
                       sizeof(HeapCall), r.size());
            HeapCall c;
            std::memcpy(&c, r.data(), sizeof c);
            all.push_back(c);
        }
        bool same = std::all_of(all.begin(), all.end(), [&](const HeapCall& c) { return c == all[0]; });
        std::string calls;
        for (std::size_t r = 0; r < all.size(); ++r)
            calls += fmt::format("{}rank {} {}", r ? ", " : "", r, describe(all[r]));
        LOOM_CHECK(same, "{}: every rank must make the same call, given: {}", what, calls);
        for (std::size_t r = 0; r < all.size(); ++r)
            LOOM_CHECK(all[r].op != HeapCall::Free || all[r].status == HeapCall::Live, "{}: rank {} {}", what, r,
                       describe(all[r]));
    }

    void shutdown() noexcept {
        if (shut_down) return;
        shut_down = true;
        bool device_ok = true;
        if (device >= 0 && (cudaSetDevice(device) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)) {
            device_ok = false;
            const cudaError_t e = cudaGetLastError();
            log(LogLevel::Warn, "warning: device {} reported '{}' at shutdown{}", device, cudaGetErrorString(e),
                diag::report_for_error(e));
        }
        if (store && device >= 0 && device_ok && barrier_at_shutdown && profile::enabled()) write_profile();
        bool all_arrived = info.world_size == 1 && barrier_at_shutdown;
        if (store && info.world_size > 1 && barrier_at_shutdown) {
            try {
                all_arrived = shutdown_barrier();
            } catch (const std::exception& e) {
                log(LogLevel::Warn, "warning: shutdown barrier failed ({}); releasing local resources", e.what());
            }
        }
        destroy_states();
        allocator.reset();
        if (remote_heap) release_remote(device_ok && all_arrived);
        heap.reset();   // local: unmaps and releases
        store.reset();  // rank 0: stops serving (every rank has left the barrier, or the wait gave up)
    }

    // NVSHMEM's unregister and finalize are collective: only after every rank passed the shutdown barrier (a dead peer
    // would hang them); otherwise the process's exit releases NVSHMEM's resources.
    void release_remote(bool collective_ok) noexcept {
        if (collective_ok) {
            try {
                if (local_registered) nvshmem::unregister_local(heap->local_base());
                nvshmem::unregister_symmetric(remote_heap, heap->size());
                nvshmem::finalize();
            } catch (const std::exception& e) {
                log(LogLevel::Warn, "warning: NVSHMEM teardown failed ({})", e.what());
            }
        }
        remote_heap = nullptr;
    }

    // LOOM_PROFILE: the trace of the records not yet written (collective, every rank's shutdown calls it).
    void write_profile() noexcept {
        try {
            const std::string path = profile::detail::write_trace_with(*store, info.rank, info.world_size, "");
            if (info.rank == 0 && !path.empty()) log(LogLevel::Warn, "profile: trace written to {}", path);
        } catch (const std::exception& e) {
            log(LogLevel::Warn, "warning: profile trace not written ({})", e.what());
        }
    }

    // Two phases over atomic counters, each bounded: "arrive" (every rank is done with the device work that
    // touches peers), then "leave" (every rank has stopped polling), after which rank 0 may stop the server.
    // A Store barrier would wait for the full store timeout; this one polls with its own bound.
    bool shutdown_barrier() {
        const auto timeout = settings().shutdown_timeout;
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        auto wait_all = [&](const std::string& key) {
            auto pause = std::chrono::milliseconds(1);
            for (;;) {
                std::int64_t n = store->add(key, 0);
                if (n >= info.world_size) return true;
                if (std::chrono::steady_clock::now() >= deadline) {
                    log(LogLevel::Warn,
                        "warning: only {} of {} ranks reached shutdown within {} ms (a peer died?); releasing local "
                        "resources",
                        n, info.world_size, timeout.count());
                    return false;
                }
                std::this_thread::sleep_for(pause);
                pause = std::min(pause * 2, std::chrono::milliseconds(20));
            }
        };
        store->add("loom/shutdown/arrive", 1);
        if (!wait_all("loom/shutdown/arrive")) return false;
        store->add("loom/shutdown/leave", 1);
        if (info.rank == 0) wait_all("loom/shutdown/leave");
        return true;
    }
};

World World::from_env(const WorldOptions& opts) { return World(settings().rank, opts); }

World::World(const RankInfo& info, const WorldOptions& opts) : impl_(std::make_unique<Impl>()) {
    try {
        init(info, opts);
    } catch (...) {
        // A failed start skips the shutdown barrier: peers fail fast on the store instead of waiting for us.
        impl_->barrier_at_shutdown = false;
        throw;
    }
}

void World::init(const RankInfo& info, const WorldOptions& opts) {
    Impl& w = *impl_;
    w.info = info;
    check_coll_scratch(opts.coll_scratch);
    w.coll_scratch = opts.coll_scratch;
    LOOM_CHECK(opts.bind_device || !opts.create_heap,
               "WorldOptions: a symmetric heap needs a device (bind_device = false with create_heap = true)");
    // Without a GPU every rank fails here alike, before anyone waits for anyone.
    if (opts.create_heap && !driver::available()) LOOM_FAIL("no GPU: {}", driver::unavailable_reason());
    w.store = std::make_unique<Store>(info.rank, info.world_size, info.master_addr, info.master_port,
                                      settings().store_timeout);
    // Node facts from the hosts (node_layout.hpp): needed by the heap, or when the launcher gave none. A World without
    // a heap and with the launcher's facts stays free of collectives in its constructor (rank 0 may publish the
    // store's port only once its World exists).
    if (info.world_size > 1 && (opts.create_heap || info.local_from_hosts)) {
        char host[HOST_NAME_MAX + 1] = {};
        ::gethostname(host, sizeof host - 1);
        const std::string mine(host);
        std::vector<std::string> hosts;
        for (const Bytes& b : w.store->all_gather("loom/world/hosts", Bytes(mine.begin(), mine.end())))
            hosts.emplace_back(b.begin(), b.end());
        // Each rank's node facts (or why it has none), exchanged so that every rank raises alike: a rank that fails
        // alone would leave the others waiting for it. Every rank must see one node size: the hierarchical algorithms
        // pair ranks of equal local rank across nodes and size their buffers by it (heterogeneous hosts under
        // --nproc-per-node=gpu would disagree).
        std::string mine_layout;
        try {
            detail::reconcile_with_hosts(w.info, hosts);
            detail::check_rank_layout(w.info);
            mine_layout = fmt::format("L{}", w.info.local_world_size);
        } catch (const Error& e) {
            mine_layout = fmt::format("E{}", e.what());
        }
        const auto all = w.store->all_gather("loom/world/node_size", Bytes(mine_layout.begin(), mine_layout.end()));
        std::vector<std::string> layouts;
        for (const Bytes& b : all) layouts.emplace_back(b.begin(), b.end());
        for (int r = 0; r < info.world_size; ++r)
            if (layouts[r][0] == 'E')
                LOOM_FAIL("World: rank {} ({}) refused its node facts: {}", r, hosts[r], layouts[r].substr(1));
        for (int r = 0; r < info.world_size; ++r)
            LOOM_CHECK(layouts[r] == layouts[info.rank],
                       "World: expected the same number of ranks on every node, given {} on rank {}'s node ({}) and {} "
                       "on rank {}'s ({})",
                       layouts[info.rank].substr(1), info.rank, hosts[info.rank], layouts[r].substr(1), r, hosts[r]);
    }
    detail::check_rank_layout(w.info);

    if (opts.bind_device && driver::available()) {
        int count = 0;
        LOOM_CHECK_CUDA(cudaGetDeviceCount(&count));
        // The GPU follows the rank's place on its host, not in its (possibly emulated) node.
        const int host_local = w.info.host_local_rank >= 0 ? w.info.host_local_rank : w.info.local_rank;
        int dev = opts.device >= 0 ? opts.device : info.device >= 0 ? info.device : host_local % count;
        LOOM_CHECK(dev < count, "device: expected an index in [0, {}) (LOOM_DEVICE / WorldOptions::device), given {}",
                   count, dev);
        LOOM_CHECK_CUDA(cudaSetDevice(dev));
        w.device = dev;
        w.diag = diag::attach(info.rank);
    }
    w.wait_timeout_ns = static_cast<std::uint64_t>(settings().wait_timeout.count()) * 1000000ull;

    if (opts.create_heap) {
        const std::size_t bytes = symmetric_heap_bytes(
            opts.symmetric_size ? opts.symmetric_size : settings().symmetric_size, w.info.num_nodes(), settings());
        w.heap = std::make_unique<SymmetricHeap>(*w.store, w.info, w.device, bytes);
        w.allocator = std::make_unique<detail::HeapAllocator>(w.heap->size());
        // Several nodes: peers on other nodes reach this heap through NVSHMEM. The heap itself stays the fd-mapped
        // one (node-local peers keep their back-to-back mapping, Ctx::heap); NVSHMEM maps the same physical memory
        // into its symmetric space, where the same offset names the same byte on every rank.
        if (w.info.num_nodes() > 1) {
            nvshmem::init(*this);
            w.remote_heap = static_cast<char*>(nvshmem::register_symmetric(w.heap->local_base(), w.heap->size()));
            // The local operands of remote operations keep the heap's own address (no second alias of the same
            // memory in this process, whose caches the language would then have to keep coherent): registered for
            // NVSHMEM's network transports.
            w.local_registered = nvshmem::register_local(w.heap->local_base(), w.heap->size());
            if (!w.local_registered)
                log(LogLevel::Warn,
                    "warning: nvshmemx_buffer_register refused the symmetric heap: remote puts / gets through a "
                    "network "
                    "transport will fail (NVLink peers are unaffected)");
        }
    }
}

World::~World() = default;  // Impl's destructor shuts down, never throwing
World::World(World&&) noexcept = default;
World& World::operator=(World&&) noexcept = default;

World::Impl& World::live() const {
    LOOM_CHECK(impl_, "World: used after it was moved from");
    LOOM_CHECK(!impl_->shut_down, "World: used after shutdown()");
    return *impl_;
}

int World::rank() const { return live().info.rank; }
int World::world_size() const { return live().info.world_size; }
int World::local_rank() const { return live().info.local_rank; }
int World::local_world_size() const { return live().info.local_world_size; }
int World::node() const { return live().info.node; }
int World::num_nodes() const { return live().info.num_nodes(); }
int World::node_of(int peer) const {
    const Impl& w = live();
    LOOM_CHECK(peer >= 0 && peer < w.info.world_size, "node_of: expected a rank in [0, {}), given {}",
               w.info.world_size, peer);
    return peer / w.info.local_world_size;
}
int World::device() const { return live().device; }
std::size_t World::coll_scratch() const { return live().coll_scratch; }
void World::set_coll_scratch(std::size_t bytes) {
    check_coll_scratch(bytes);
    live().coll_scratch = bytes;
}
const RankInfo& World::info() const { return live().info; }
Store& World::store() { return *live().store; }

void World::barrier(const std::string& tag) { live().store->barrier("loom/world/" + tag); }

void* World::alloc_bytes(std::size_t bytes, std::size_t alignment) {
    Impl& w = live();
    w.agree(HeapCall{HeapCall::Alloc, 0, bytes, alignment}, "symmetric alloc");
    // From here every rank holds the same request and the same allocator state: the outcome is identical.
    LOOM_CHECK(w.heap, "symmetric alloc: this World has no symmetric heap (created with create_heap = false)");
    LOOM_CHECK(bytes > 0, "symmetric alloc: expected a positive size, given 0 bytes");
    LOOM_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0 && alignment <= w.heap->granularity(),
               "symmetric alloc: expected a power-of-two alignment of at most {}, given {}", w.heap->granularity(),
               alignment);
    auto offset = w.allocator->allocate(bytes, alignment);
    LOOM_CHECK(offset,
               "symmetric heap exhausted: requested {} bytes, largest free block {} of {}; raise "
               "LOOM_SYMMETRIC_SIZE",
               bytes, w.allocator->largest_free_block(), w.allocator->capacity());
    return w.heap->local_base() + *offset;
}

void World::free(void* p) {
    Impl& w = live();
    HeapCall mine{HeapCall::Free, HeapCall::NotInHeap, reinterpret_cast<std::uintptr_t>(p), 0};
    if (w.heap && is_symmetric(p)) {
        mine.a = static_cast<std::uint64_t>(static_cast<char*>(p) - w.heap->local_base());
        mine.status = w.allocator->allocation_size(mine.a) ? HeapCall::Live : HeapCall::NotAnAllocation;
    }
    w.agree(mine, "symmetric free");
    w.allocator->free(mine.a);
    detail::bump_memory_generation();  // calls checked with it may not replay unchecked (pointer_check.hpp)
}

bool World::is_symmetric(const void* p, std::size_t bytes) const {
    const Impl& w = live();
    if (!w.heap) return false;
    auto c = reinterpret_cast<std::uintptr_t>(p), base = reinterpret_cast<std::uintptr_t>(w.heap->local_base());
    return c >= base && c - base < w.heap->size() && bytes <= w.heap->size() - (c - base);
}

std::optional<World::Allocation> World::symmetric_allocation(const void* p) const {
    const Impl& w = live();
    if (!w.heap || !is_symmetric(p)) return std::nullopt;
    const auto a = w.allocator->allocation_containing(
        static_cast<std::size_t>(static_cast<const char*>(p) - w.heap->local_base()));
    if (!a) return std::nullopt;
    return Allocation{w.heap->local_base() + a->first, a->second};
}

void* World::peer_ptr(const void* p, int peer) const {
    const Impl& w = live();
    LOOM_CHECK(w.heap, "peer_ptr: this World has no symmetric heap");
    const int first = w.info.node * w.info.local_world_size;
    LOOM_CHECK(peer >= first && peer < first + w.info.local_world_size,
               "peer_ptr: expected a peer on this node (ranks {}..{}), given rank {}", first,
               first + w.info.local_world_size - 1, peer);
    LOOM_CHECK(is_symmetric(p), "peer_ptr: expected a pointer into this rank's symmetric heap [{}, {}), given {}",
               static_cast<void*>(w.heap->local_base()), static_cast<void*>(w.heap->local_base() + w.heap->size()), p);
    return w.heap->base(peer - first) + (static_cast<const char*>(p) - w.heap->local_base());
}

Ctx World::ctx() const {
    const Impl& w = live();
    Ctx c{};
    c.rank = w.info.rank;
    c.world = w.info.world_size;
    c.local_rank = w.info.local_rank;
    c.local_world = w.info.local_world_size;
    c.node = w.info.node;
    c.local_base_rank = w.info.node * w.info.local_world_size;
    c.wait_timeout_ns = w.wait_timeout_ns;
    c.heap_size = w.heap ? w.heap->size() : 0;
    c.diag = w.diag;
    c.remote_heap = w.remote_heap;
    for (int i = 0; i < kMaxLocalPeers; ++i)
        c.heap[i] = w.heap && i < w.info.local_world_size ? w.heap->base(i) : nullptr;
    return c;
}

SymmetricHeap& World::heap() {
    Impl& w = live();
    LOOM_CHECK(w.heap, "World::heap: this World has no symmetric heap (created with create_heap = false)");
    return *w.heap;
}

WorldState* World::find_state(std::string_view key, const std::type_info& type) {
    Impl& w = live();
    std::lock_guard<std::mutex> lock(w.states_mu);
    const auto it = w.states.find(key);
    if (it == w.states.end()) return nullptr;
    LOOM_CHECK(it->second.type == std::type_index(type),
               "World::state: key '{}' is held by another state type ({}), "
               "asked for {}",
               key, it->second.type.name(), type.name());
    return it->second.state.get();
}

WorldState& World::adopt_state(std::string_view key, const std::type_info& type, std::unique_ptr<WorldState> s) {
    Impl& w = live();
    std::lock_guard<std::mutex> lock(w.states_mu);
    auto [it, fresh] = w.states.try_emplace(std::string(key), Impl::StateEntry{std::type_index(type), nullptr, 0});
    LOOM_CHECK(fresh, "World::state: key '{}' was created twice (two threads using one World at once?)", key);
    it->second.state = std::move(s);
    it->second.order = w.states_created++;
    return *it->second.state;
}

void World::release_states(std::string_view prefix) {
    Impl& w = live();
    std::vector<std::pair<std::string, std::unique_ptr<WorldState>>> mine;
    {
        std::lock_guard<std::mutex> lock(w.states_mu);
        for (auto it = w.states.begin(); it != w.states.end();) {
            if (std::string_view(it->first).substr(0, prefix.size()) == prefix) {
                mine.emplace_back(it->first, std::move(it->second.state));
                it = w.states.erase(it);
            } else {
                ++it;
            }
        }
    }
    // Every rank releases (or has no state to release) together: the count decides whether peers must be met.
    if (mine.empty()) return;
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    barrier(fmt::format("release-states/{}", prefix));  // no peer still reads these states' buffers
    for (auto& [key, st] : mine) st->release(*this);    // key order: the same collective frees on every rank
}

void World::shutdown() {
    if (impl_) impl_->shutdown();
}

bool World::is_shut_down() const { return !impl_ || impl_->shut_down; }

}  // namespace loom
