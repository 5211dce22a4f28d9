// loom::nvshmem: NVSHMEM's host library through dlopen (see nvshmem.hpp for why).
#include "loom/runtime/nvshmem.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "jit/toolchain.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

namespace loom::nvshmem {
namespace {

// NVSHMEM's versioned init structures (device_host/nvshmem_types.h, bootstrap_device_host/nvshmem_uniqueid.h of
// NVSHMEM 3.x). Their sizes are part of NVSHMEM's ABI (the headers static_assert them) and each carries its
// own version word, so mirroring them here keeps libloom free of NVSHMEM's headers at build time.
struct UniqueId {
    int version;
    char internal[124];
};
static_assert(sizeof(UniqueId) == 128);
struct UniqueIdArgs {
    int version;
    UniqueId* id;
    int myrank;
    int nranks;
};
static_assert(sizeof(UniqueIdArgs) == 24);
struct InitArgs {
    int version;
    UniqueIdArgs uid_args;
    char content[96];
};
static_assert(sizeof(InitArgs) == 128);
struct InitAttr {
    int version;
    void* mpi_comm;
    InitArgs args;
};
static_assert(sizeof(InitAttr) == 144);
constexpr int kVersion1 = 1 << 16;
constexpr unsigned kInitWithUniqueId = 1u << 3;  // NVSHMEMX_INIT_WITH_UNIQUEID
constexpr int kTeamWorld = 0;                    // NVSHMEM_TEAM_WORLD

#define LOOM_NVSHMEM_FUNCTIONS(X)                                                                          \
    X(nvshmemx_get_uniqueid, int(UniqueId*))                                                               \
    X(nvshmemx_set_attr_uniqueid_args, int(int, int, const UniqueId*, InitAttr*))                          \
    X(nvshmemx_hostlib_init_attr, int(unsigned, InitAttr*))                                                \
    X(nvshmemx_hostlib_finalize, void())                                                                   \
    X(nvshmemx_culibrary_init, int(CUlibrary))                                                             \
    X(nvshmemx_cumodule_init, int(CUmodule))                                                               \
    X(nvshmem_my_pe, int())                                                                                \
    X(nvshmem_n_pes, int())                                                                                \
    X(nvshmem_malloc, void*(std::size_t))                                                                  \
    X(nvshmemx_buffer_register_symmetric, void*(void*, std::size_t, int))                                  \
    X(nvshmemx_buffer_unregister_symmetric, int(void*, std::size_t))                                       \
    X(nvshmemx_buffer_register, int(void*, std::size_t))                                                   \
    X(nvshmemx_buffer_unregister, int(void*))                                                              \
    X(nvshmem_free, void(void*))                                                                           \
    X(nvshmem_barrier_all, void())                                                                         \
    X(nvshmemx_barrier_all_on_stream, void(cudaStream_t))                                                  \
    X(nvshmemx_quiet_on_stream, void(cudaStream_t))                                                        \
    X(nvshmemx_fcollectmem_on_stream, int(int, void*, const void*, std::size_t, cudaStream_t))             \
    X(nvshmemx_alltoallmem_on_stream, int(int, void*, const void*, std::size_t, cudaStream_t))             \
    X(nvshmemx_float_sum_reduce_on_stream, int(int, void*, const void*, std::size_t, cudaStream_t))        \
    X(nvshmemx_half_sum_reduce_on_stream, int(int, void*, const void*, std::size_t, cudaStream_t))         \
    X(nvshmemx_bfloat16_sum_reduce_on_stream, int(int, void*, const void*, std::size_t, cudaStream_t))     \
    X(nvshmemx_float_sum_reducescatter_on_stream, int(int, void*, const void*, std::size_t, cudaStream_t)) \
    X(nvshmemx_half_sum_reducescatter_on_stream, int(int, void*, const void*, std::size_t, cudaStream_t))  \
    X(nvshmemx_bfloat16_sum_reducescatter_on_stream, int(int, void*, const void*, std::size_t, cudaStream_t))

struct Lib {
    void* handle = nullptr;
    std::string path;
#define LOOM_NVSHMEM_DECLARE(name, type) std::add_pointer_t<type> name = nullptr;
    LOOM_NVSHMEM_FUNCTIONS(LOOM_NVSHMEM_DECLARE)
#undef LOOM_NVSHMEM_DECLARE
};

std::mutex g_mu;
Lib g_lib;
bool g_initialized = false;
int g_generation = 0;  // init/finalize rounds, so that store keys of a re-init never collide

const Lib& lib() {
    std::lock_guard lock(g_mu);
    if (g_lib.handle) return g_lib;
    std::string path = jit::detail::nvshmem_home().home + "/lib/libnvshmem_host.so.3";
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    LOOM_CHECK(h, "cannot load NVSHMEM's host library {}: {}", path, ::dlerror());
    Lib l;
    l.handle = h;
    l.path = path;
    std::string missing;
#define LOOM_NVSHMEM_RESOLVE(name, type)                                    \
    l.name = reinterpret_cast<std::add_pointer_t<type>>(::dlsym(h, #name)); \
    if (!l.name) missing += missing.empty() ? #name : ", " #name;
    LOOM_NVSHMEM_FUNCTIONS(LOOM_NVSHMEM_RESOLVE)
#undef LOOM_NVSHMEM_RESOLVE
    LOOM_CHECK(missing.empty(), "{} lacks entry points Loom needs: {}", path, missing);
    g_lib = l;
    return g_lib;
}

const Lib& ready() {
    LOOM_CHECK(g_initialized, "NVSHMEM is not initialised: call loom::nvshmem::init(world) first");
    return lib();
}

void check_rc(int rc, const char* what) {
    if (rc != 0) throw Error(what, fmt::format("returned {}", rc), __FILE__, __LINE__);
}

}  // namespace

void init(World& world) {
    LOOM_CHECK(!g_initialized, "loom::nvshmem::init: NVSHMEM is already initialised (call finalize() first)");
    // NVLink multicast can take a shared machine's GPUs out of service: never let NVSHMEM use it.
    ::setenv("NVSHMEM_DISABLE_NVLS", "1", /*overwrite=*/1);
    const Lib& l = lib();
    UniqueId uid{};
    uid.version = kVersion1 + static_cast<int>(sizeof(UniqueId));
    std::string key = fmt::format("loom/nvshmem/uid/{}", g_generation);
    if (world.rank() == 0) {
        check_rc(l.nvshmemx_get_uniqueid(&uid), "nvshmemx_get_uniqueid");
        world.store().set(key, std::string(reinterpret_cast<const char*>(&uid), sizeof uid));
    } else {
        std::string bytes = world.store().get_string(key);
        LOOM_CHECK(bytes.size() == sizeof uid, "NVSHMEM unique id from the store: expected {} bytes, given {}",
                   sizeof uid, bytes.size());
        std::memcpy(&uid, bytes.data(), sizeof uid);
    }
    InitAttr attr{};
    attr.version = kVersion1 + static_cast<int>(sizeof(InitAttr));
    attr.args.version = kVersion1 + static_cast<int>(sizeof(InitArgs));
    attr.args.uid_args.version = kVersion1 + static_cast<int>(sizeof(UniqueIdArgs));
    attr.args.uid_args.myrank = -1;
    attr.args.uid_args.nranks = -1;
    check_rc(l.nvshmemx_set_attr_uniqueid_args(world.rank(), world.world_size(), &uid, &attr),
             "nvshmemx_set_attr_uniqueid_args");
    check_rc(l.nvshmemx_hostlib_init_attr(kInitWithUniqueId, &attr), "nvshmemx_hostlib_init_attr");
    int pe = l.nvshmem_my_pe(), npes = l.nvshmem_n_pes();
    LOOM_CHECK(pe == world.rank() && npes == world.world_size(),
               "NVSHMEM initialised as PE {} of {}, expected rank {} of {}", pe, npes, world.rank(),
               world.world_size());
    std::lock_guard lock(g_mu);
    g_initialized = true;
    ++g_generation;
}

bool initialized() { return g_initialized; }

void finalize() {
    if (!g_initialized) return;
    lib().nvshmemx_hostlib_finalize();
    std::lock_guard lock(g_mu);
    g_initialized = false;
}

void init_library(CUlibrary library) { check_rc(ready().nvshmemx_culibrary_init(library), "nvshmemx_culibrary_init"); }
void init_module(CUmodule module) { check_rc(ready().nvshmemx_cumodule_init(module), "nvshmemx_cumodule_init"); }

int my_pe() { return ready().nvshmem_my_pe(); }
int n_pes() { return ready().nvshmem_n_pes(); }

void* malloc(std::size_t bytes) {
    void* p = ready().nvshmem_malloc(bytes);
    LOOM_CHECK(p || bytes == 0, "nvshmem_malloc({} bytes) failed (NVSHMEM_SYMMETRIC_SIZE too small?)", bytes);
    return p;
}
void free(void* p) { ready().nvshmem_free(p); }

void* register_symmetric(void* buf, std::size_t bytes) {
    void* p = ready().nvshmemx_buffer_register_symmetric(buf, bytes, 0);
    LOOM_CHECK(p,
               "nvshmemx_buffer_register_symmetric({}, {} bytes) failed: NVSHMEM cannot map this rank's symmetric "
               "heap (run with NVSHMEM_DEBUG=INFO for its reason)",
               buf, bytes);
    return p;
}
bool register_local(void* buf, std::size_t bytes) { return ready().nvshmemx_buffer_register(buf, bytes) == 0; }
void unregister_local(void* buf) { ready().nvshmemx_buffer_unregister(buf); }

void unregister_symmetric(void* symmetric, std::size_t bytes) {
    check_rc(ready().nvshmemx_buffer_unregister_symmetric(symmetric, bytes), "nvshmemx_buffer_unregister_symmetric");
}
void barrier_all() { ready().nvshmem_barrier_all(); }
void barrier_all_on_stream(cudaStream_t s) { ready().nvshmemx_barrier_all_on_stream(s); }
void quiet_on_stream(cudaStream_t s) { ready().nvshmemx_quiet_on_stream(s); }

void fcollect_on_stream(void* dest, const void* src, std::size_t bytes, cudaStream_t s) {
    check_rc(ready().nvshmemx_fcollectmem_on_stream(kTeamWorld, dest, src, bytes, s), "nvshmemx_fcollectmem_on_stream");
}
void alltoall_on_stream(void* dest, const void* src, std::size_t bytes, cudaStream_t s) {
    check_rc(ready().nvshmemx_alltoallmem_on_stream(kTeamWorld, dest, src, bytes, s), "nvshmemx_alltoallmem_on_stream");
}

void sum_reduce_on_stream(DType t, void* dest, const void* src, std::size_t count, cudaStream_t s) {
    const Lib& l = ready();
    switch (t) {
        case DType::F32:
            return check_rc(l.nvshmemx_float_sum_reduce_on_stream(kTeamWorld, dest, src, count, s), "sum_reduce");
        case DType::F16:
            return check_rc(l.nvshmemx_half_sum_reduce_on_stream(kTeamWorld, dest, src, count, s), "sum_reduce");
        case DType::BF16:
            return check_rc(l.nvshmemx_bfloat16_sum_reduce_on_stream(kTeamWorld, dest, src, count, s), "sum_reduce");
        default:
            LOOM_FAIL("nvshmem::sum_reduce_on_stream: expected dtype F32, F16 or BF16, given {}", static_cast<int>(t));
    }
}

void sum_reducescatter_on_stream(DType t, void* dest, const void* src, std::size_t count, cudaStream_t s) {
    const Lib& l = ready();
    switch (t) {
        case DType::F32:
            return check_rc(l.nvshmemx_float_sum_reducescatter_on_stream(kTeamWorld, dest, src, count, s),
                            "sum_reducescatter");
        case DType::F16:
            return check_rc(l.nvshmemx_half_sum_reducescatter_on_stream(kTeamWorld, dest, src, count, s),
                            "sum_reducescatter");
        case DType::BF16:
            return check_rc(l.nvshmemx_bfloat16_sum_reducescatter_on_stream(kTeamWorld, dest, src, count, s),
                            "sum_reducescatter");
        default:
            LOOM_FAIL("nvshmem::sum_reducescatter_on_stream: expected dtype F32, F16 or BF16, given {}",
                      static_cast<int>(t));
    }
}

std::string library_path() {
    std::lock_guard lock(g_mu);
    return g_lib.path;
}

std::string version() { return jit::detail::nvshmem_home().version; }

}  // namespace loom::nvshmem
