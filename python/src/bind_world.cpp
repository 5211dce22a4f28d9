// loom._C: rank facts, the World and its symmetric allocations.
#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/env.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"
#include "world_handle.hpp"

namespace loom::py {

namespace nb = nanobind;
using Handle = std::shared_ptr<WorldHandle>;

namespace {

nb::dict rank_info_dict(const RankInfo& r) {
    nb::dict d;
    d["rank"] = r.rank;
    d["world_size"] = r.world_size;
    d["local_rank"] = r.local_rank;
    d["local_world_size"] = r.local_world_size;
    d["node"] = r.node;
    d["master_addr"] = r.master_addr;
    d["master_port"] = r.master_port;
    d["source"] = r.source;
    d["device"] = r.device;
    return d;
}

WorldOptions world_options(std::size_t symmetric_size, std::size_t coll_scratch, int device, bool create_heap,
                           bool bind_device) {
    WorldOptions o;
    o.symmetric_size = symmetric_size;
    if (coll_scratch) o.coll_scratch = coll_scratch;
    o.device = device;
    o.create_heap = create_heap;
    o.bind_device = bind_device;
    return o;
}

Handle make_world(int rank, int world_size, int local_rank, int local_world_size, const std::string& master_addr,
                  int master_port, std::size_t symmetric_size, std::size_t coll_scratch, int device, bool create_heap,
                  bool bind_device) {
    RankInfo info;
    info.rank = rank;
    info.world_size = world_size;
    info.local_rank = local_rank < 0 ? rank : local_rank;
    info.local_world_size = local_world_size < 0 ? world_size : local_world_size;
    LOOM_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
               "World: expected 0 <= rank < world_size, given rank {} and world_size {}", rank, world_size);
    LOOM_CHECK(info.local_world_size >= 1 && world_size % info.local_world_size == 0 &&
                   info.local_rank == rank % info.local_world_size,
               "World: ranks are laid out node by node (local_rank == rank % local_world_size, local_world_size "
               "divides world_size); given rank {}, world_size {}, local_rank {}, local_world_size {}",
               rank, world_size, info.local_rank, info.local_world_size);
    info.node = rank / info.local_world_size;
    info.master_addr = master_addr;
    info.master_port = master_port;
    info.source = "python";
    info.device = device;
    WorldOptions opts = world_options(symmetric_size, coll_scratch, device, create_heap, bind_device);
    nb::gil_scoped_release unlocked;  // collective: blocks until every rank arrives
    return std::make_shared<WorldHandle>(World(info, opts));
}

// A uint8 DLPack view of [ptr, ptr + nbytes) on `device`, keeping `owner` (a SymAlloc) alive. The range must lie in
// the owner's allocation or in its copy in a peer's heap.
nb::ndarray<> export_bytes(nb::handle owner, std::uintptr_t ptr, std::size_t nbytes, int device) {
    SymAlloc& a = nb::cast<SymAlloc&>(owner);
    auto inside = [&](std::uintptr_t base) { return ptr >= base && ptr + nbytes <= base + a.bytes; };
    bool ok = inside(reinterpret_cast<std::uintptr_t>(a.ptr));
    World& w = a.world->world;
    const int first = w.node() * w.local_world_size();
    for (int r = first; !ok && r < first + w.local_world_size(); ++r)
        ok = inside(reinterpret_cast<std::uintptr_t>(w.peer_ptr(a.ptr, r)));
    LOOM_CHECK(ok, "export_bytes: [{:#x}, +{}) is not inside the allocation at {} ({} bytes) or a peer's copy of it",
               ptr, nbytes, a.ptr, a.bytes);
    std::size_t shape[1] = {nbytes};
    return nb::ndarray<>(reinterpret_cast<void*>(ptr), 1, shape, owner, nullptr, nb::dtype<std::uint8_t>(),
                         nb::device::cuda::value, device);
}

}  // namespace

void bind_world(nb::module_& m) {
    m.def(
        "rank_info_from_env",
        [](std::optional<std::map<std::string, std::string>> env) {
            if (!env) return rank_info_dict(rank_info_from_env());
            auto vars = *env;
            EnvLookup lookup = [vars](const std::string& k) -> std::optional<std::string> {
                auto it = vars.find(k);
                if (it == vars.end() || it->second.empty()) return std::nullopt;
                return it->second;
            };
            return rank_info_dict(rank_info_from_env(lookup));
        },
        nb::arg("env") = nb::none(),
        "The rank facts Loom reads from the environment (LOOM_*, torchrun's, Open MPI's, Slurm's), parsed from "
        "`env` (a dict) or the process's environment");

    nb::class_<SymAlloc>(m, "SymAlloc", nb::is_weak_referenceable(),
                         "One symmetric allocation; freed (collectively, deferred) when dropped")
        .def_prop_ro("ptr", [](const SymAlloc& a) { return reinterpret_cast<std::uintptr_t>(a.ptr); })
        .def_prop_ro("nbytes", [](const SymAlloc& a) { return a.bytes; });
    m.def("export_bytes", &export_bytes, nb::arg("owner"), nb::arg("ptr"), nb::arg("nbytes"), nb::arg("device"));

    nb::class_<WorldHandle>(m, "World")
        .def_static(
            "from_env",
            [](std::size_t symmetric_size, std::size_t coll_scratch, int device, bool create_heap, bool bind_device) {
                WorldOptions opts = world_options(symmetric_size, coll_scratch, device, create_heap, bind_device);
                nb::gil_scoped_release unlocked;
                return std::make_shared<WorldHandle>(World::from_env(opts));
            },
            nb::arg("symmetric_size") = 0, nb::arg("coll_scratch") = 0, nb::arg("device") = -1,
            nb::arg("create_heap") = true, nb::arg("bind_device") = true)
        .def_static("create", &make_world, nb::arg("rank"), nb::arg("world_size"), nb::arg("local_rank") = -1,
                    nb::arg("local_world_size") = -1, nb::arg("master_addr") = "127.0.0.1",
                    nb::arg("master_port") = 29500, nb::arg("symmetric_size") = 0, nb::arg("coll_scratch") = 0,
                    nb::arg("device") = -1, nb::arg("create_heap") = true, nb::arg("bind_device") = true)
        .def_prop_ro("rank", [](WorldHandle& h) { return h.world.rank(); })
        .def_prop_ro("world_size", [](WorldHandle& h) { return h.world.world_size(); })
        .def_prop_ro("local_rank", [](WorldHandle& h) { return h.world.local_rank(); })
        .def_prop_ro("local_world_size", [](WorldHandle& h) { return h.world.local_world_size(); })
        .def_prop_ro("node", [](WorldHandle& h) { return h.world.node(); })
        .def_prop_ro("device", [](WorldHandle& h) { return h.world.device(); })
        .def_prop_ro("info", [](WorldHandle& h) { return rank_info_dict(h.world.info()); })
        .def_prop_ro("heap_size", [](WorldHandle& h) { return h.world.heap().size(); })
        .def(
            "alloc",
            [](const Handle& h, std::size_t bytes) {
                void* p = nullptr;
                {
                    nb::gil_scoped_release unlocked;
                    h->collect();
                    p = h->world.alloc_bytes(bytes, 256);
                }
                return std::make_unique<SymAlloc>(h, p, bytes);
            },
            nb::arg("nbytes"), "collective: frees what every rank dropped, then allocates (same offset everywhere)")
        .def(
            "collect",
            [](WorldHandle& h) {
                nb::gil_scoped_release unlocked;
                return h.collect();
            },
            "collective: frees the symmetric allocations every rank has dropped; returns how many")
        .def("pending_frees",
             [](WorldHandle& h) {
                 std::lock_guard<std::mutex> lock(h.mu);
                 return h.pending.size();
             })
        .def("peer_ptr",
             [](WorldHandle& h, std::uintptr_t p, int peer) {
                 return reinterpret_cast<std::uintptr_t>(h.world.peer_ptr(reinterpret_cast<void*>(p), peer));
             })
        .def("is_symmetric", [](WorldHandle& h, std::uintptr_t p,
                                std::size_t bytes) { return h.world.is_symmetric(reinterpret_cast<void*>(p), bytes); })
        .def("ctx",
             [](WorldHandle& h) {
                 const Ctx c = h.world.ctx();
                 return nb::bytes(reinterpret_cast<const char*>(&c), sizeof c);
             })
        .def(
            "all_gather_bytes",
            [](WorldHandle& h, const std::string& tag, nb::bytes mine) {
                Bytes b(static_cast<const std::uint8_t*>(mine.data()),
                        static_cast<const std::uint8_t*>(mine.data()) + mine.size());
                std::vector<Bytes> all;
                {
                    nb::gil_scoped_release unlocked;
                    all = h.world.store().all_gather("loom.python/" + tag, b);
                }
                nb::list out;
                for (const Bytes& v : all) out.append(nb::bytes(reinterpret_cast<const char*>(v.data()), v.size()));
                return out;
            },
            "collective: every rank's bytes, in rank order, over the bootstrap store")
        .def(
            "barrier",
            [](WorldHandle& h, const std::string& tag) {
                nb::gil_scoped_release unlocked;
                h.world.barrier(tag);
            },
            nb::arg("tag") = "")
        .def("shutdown",
             [](WorldHandle& h) {
                 nb::gil_scoped_release unlocked;
                 h.shutdown();
             })
        .def_prop_ro("is_shut_down", [](WorldHandle& h) { return h.world.is_shut_down(); })
        .def("release_collective_state",
             [](WorldHandle& h) {
                 nb::gil_scoped_release unlocked;
                 release_collective_state(h.world);
             })
        .def("release_overlap_state", [](WorldHandle& h) {
            nb::gil_scoped_release unlocked;
            release_overlap_state(h.world);
        });
}

}  // namespace loom::py
