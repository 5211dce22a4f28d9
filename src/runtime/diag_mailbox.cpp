#include "runtime/diag_mailbox.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "runtime/log.hpp"

namespace loom::diag {
namespace {

// Process-wide state. `host` and `rank` are atomics so report() needs no lock (it runs inside error paths,
// possibly raised while attach() or bind_library() hold `mu`).
struct State {
    std::mutex mu;
    std::atomic<DiagMailbox*> host{nullptr};  // never freed once set
    std::atomic<int> rank{-1};
    DiagMailbox* device = nullptr;  // the same memory as the device addresses it
    // loom_diag_mailbox of the modules loaded before the mailbox existed, written once at its creation. Modules
    // loaded later are written at load. The device address never changes afterwards, so no global is ever
    // rewritten (a rewrite could hit a module of a context that was since reset).
    std::vector<CUdeviceptr> pending;
};

State& state() {
    static State* s = new State;  // never destroyed: error paths may run during static destruction
    return *s;
}

// One 8-byte host-to-device copy on a private non-blocking stream: it never waits for the legacy stream, so a
// kernel already running (perhaps waiting on a peer that waits on us) cannot block it.
// Returns the first error (also left as the runtime's last error when not sticky: the caller clears it).
cudaError_t write_global(CUdeviceptr global, const void* value, std::size_t bytes) {
    cudaStream_t s = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return e;
    e = cudaMemcpyAsync(reinterpret_cast<void*>(global), value, bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return e;
}
cudaError_t write_pointer(CUdeviceptr global, DiagMailbox* value) { return write_global(global, &value, sizeof value); }

// At debug level every timed-out wait of the module prints its own line (lang/spin.cuh): loom_wait_verbose = 1.
void bind_verbose(CUlibrary library) {
    if (!log_enabled(LogLevel::Debug)) return;
    CUdeviceptr global = 0;
    std::size_t bytes = 0;
    if (driver::api().cuLibraryGetGlobal(&global, &bytes, library, "loom_wait_verbose") != CUDA_SUCCESS ||
        bytes != sizeof(std::uint32_t))
        return;  // no Loom wait in the module (or a foreign global of that name)
    const std::uint32_t one = 1;
    if (const cudaError_t e = write_global(global, &one, sizeof one); e != cudaSuccess) {
        if (is_sticky_device_error(e)) LOOM_CHECK_CUDA(e);
        cudaGetLastError();
    }
}

std::string tag_text(const char* tag) {
    std::string t(tag, strnlen(tag, kDiagTagBytes));
    for (char& c : t)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
    return t.empty() ? "(none)" : t;
}

const char* cmp_text(uint32_t cmp) {
    static const char* const names[] = {"==", "!=", ">=", ">", "<=", "<"};  // lang::Cmp order
    return cmp < 6 ? names[cmp] : "?";
}

}  // namespace

bool is_sticky_device_error(int code) {
    switch (code) {
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchTimeout:
        case cudaErrorAssert:
        case cudaErrorHardwareStackError:
        case cudaErrorIllegalInstruction:
        case cudaErrorMisalignedAddress:
        case cudaErrorInvalidAddressSpace:
        case cudaErrorInvalidPc:
        case cudaErrorLaunchFailure:
            return true;
        default:
            return false;
    }
}
static_assert(cudaErrorIllegalAddress == static_cast<int>(CUDA_ERROR_ILLEGAL_ADDRESS) &&
                  cudaErrorLaunchFailure == static_cast<int>(CUDA_ERROR_LAUNCH_FAILED) &&
                  cudaErrorIllegalInstruction == static_cast<int>(CUDA_ERROR_ILLEGAL_INSTRUCTION),
              "runtime and driver share the sticky error numbers");

std::string format_record(const DiagRecord& r, int fallback_rank) {
    const int rank = r.rank >= 0 ? r.rank : fallback_rank;
    const std::string who =
        fmt::format("rank {} block ({},{},{}) thread {}", rank, r.block[0], r.block[1], r.block[2], r.thread);
    const std::string tag = tag_text(r.tag);
    switch (static_cast<DiagKind>(r.kind)) {
        case DiagKind::Signal:
            return fmt::format("wait timeout: {} tag {} at {:#x} expected {} {} observed {} after {} ms (sm {})", who,
                               tag, r.addr, cmp_text(r.cmp), r.expected, r.observed, r.elapsed / 1000000u, r.smid);
        case DiagKind::Mbarrier:
            return fmt::format(
                "wait timeout: {} tag {} at {:#x} (mbarrier) expected the phase with parity {} to complete, barrier "
                "word {:#018x} after {} cycles (sm {})",
                who, tag, r.addr, r.expected, r.observed, r.elapsed, r.smid);
        case DiagKind::BadPeer: {
            const auto base = static_cast<uint32_t>(r.observed), local_world = static_cast<uint32_t>(r.observed >> 32);
            return fmt::format(
                "symm_at: {}: peer {} is not load/store reachable (local ranks {}..{}) or {:#x} is not in this "
                "rank's symmetric heap (sm {})",
                who, static_cast<int64_t>(r.expected), base, base + local_world - 1, r.addr, r.smid);
        }
        case DiagKind::BadIndex:
            return fmt::format("bad index: {} tag {}: index {} read at {:#x} is out of range [0, {}) (sm {})", who, tag,
                               static_cast<int64_t>(r.observed), r.addr, r.expected, r.smid);
    }
    return fmt::format("diagnostic record of unknown kind {}: {} tag {} at {:#x} expected {} observed {}", r.kind, who,
                       tag, r.addr, r.expected, r.observed);
}

std::string format_mailbox(const DiagMailbox& m, int fallback_rank) {
    if (__atomic_load_n(&m.magic, __ATOMIC_ACQUIRE) != kDiagMagic) return "";
    const uint32_t claimed = __atomic_load_n(&m.claimed, __ATOMIC_ACQUIRE);
    std::string out;
    uint32_t complete = 0;
    for (uint32_t i = 0; i < kDiagRecords; ++i) {
        // `state` is stored last with release.sys by the device: acquire here, then the fields are settled.
        if (__atomic_load_n(&m.records[i].state, __ATOMIC_ACQUIRE) != kDiagRecordComplete) continue;
        DiagRecord r;
        std::memcpy(&r, &m.records[i], sizeof r);
        out += fmt::format("{}  {}", out.empty() ? "" : "\n", format_record(r, fallback_rank));
        ++complete;
    }
    const uint32_t recorded = claimed < kDiagRecords ? claimed : kDiagRecords;
    if (recorded > complete)
        out += fmt::format("{}  ({} record(s) claimed but not completed when the kernel stopped)",
                           out.empty() ? "" : "\n", recorded - complete);
    if (claimed > kDiagRecords)
        out += fmt::format("{}  ({} more timed-out wait(s) not recorded: the mailbox holds {})",
                           out.empty() ? "" : "\n", claimed - kDiagRecords, kDiagRecords);
    return out;
}

std::string report() {
    try {
        const DiagMailbox* m = state().host.load(std::memory_order_acquire);
        return m ? format_mailbox(*m, state().rank.load(std::memory_order_relaxed)) : std::string();
    } catch (...) {
        return "";  // formatting failed (out of memory): the error being raised matters more
    }
}

std::string report_for_error(int code) {
    if (!is_sticky_device_error(code)) return "";
    std::string r = report();
    return r.empty() ? r : "; device diagnostics (loom mailbox):\n" + r;
}

namespace {

// The diagnostics must never take the job down: a mailbox that cannot be set up costs its reports (said once on
// stderr), not the World or the kernel load.
void warn_once(const std::string& what) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
        log(LogLevel::Warn,
            "warning: diagnostic mailbox unavailable ({}); a timed-out wait in a kernel without printf will trap "
            "without a report",
            what);
}

DiagMailbox* create_mailbox(DiagMailbox*& device) {
    // Our own page, registered rather than cudaHostAlloc'd: it stays readable by the host even if the context
    // that registered it is reset, so a late error path never reads freed memory.
    const std::size_t bytes = (sizeof(DiagMailbox) + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, bytes);
    LOOM_CHECK(p, "diagnostic mailbox: expected {} bytes of host memory, allocation failed", bytes);
    std::memset(p, 0, bytes);
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    void* d = nullptr;
    if (e == cudaSuccess) {
        e = cudaHostGetDevicePointer(&d, p, 0);
        if (e != cudaSuccess) cudaHostUnregister(p);
    }
    if (e != cudaSuccess) {
        if (!is_sticky_device_error(e)) cudaGetLastError();  // ours: do not leave it for the caller's next check
        std::free(p);
        LOOM_CHECK_CUDA(e);
    }
    device = static_cast<DiagMailbox*>(d);
    auto* host = static_cast<DiagMailbox*>(p);
    host->capacity = kDiagRecords;
    __atomic_store_n(&host->magic, kDiagMagic, __ATOMIC_RELEASE);
    return host;
}

}  // namespace

DiagMailbox* attach(int rank) {
    State& s = state();
    std::lock_guard lock(s.mu);
    DiagMailbox* host = s.host.load();
    if (!host) {
        try {
            host = create_mailbox(s.device);
        } catch (const Error& e) {
            warn_once(e.what());
            return nullptr;
        }
        s.host.store(host, std::memory_order_release);
        std::vector<CUdeviceptr> pending;
        pending.swap(s.pending);
        for (CUdeviceptr g : pending) {
            if (const cudaError_t e = write_pointer(g, s.device); e != cudaSuccess) {
                if (!is_sticky_device_error(e)) cudaGetLastError();
                warn_once(fmt::format("binding a module loaded before the World: {}", cudaGetErrorString(e)));
            }
        }
    }
    // A fresh World starts with an empty mailbox (no kernel of this process runs while a World is created).
    for (auto& r : host->records) __atomic_store_n(&r.state, 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&host->claimed, 0u, __ATOMIC_RELEASE);
    s.rank.store(rank, std::memory_order_relaxed);
    return s.device;
}

void bind_library(CUlibrary library) {
    bind_verbose(library);
    CUdeviceptr global = 0;
    std::size_t bytes = 0;
    const CUresult r = driver::api().cuLibraryGetGlobal(&global, &bytes, library, "loom_diag_mailbox");
    if (r == CUDA_ERROR_NOT_FOUND) return;  // the module includes no Loom wait
    LOOM_CHECK_CU(r);
    LOOM_CHECK(bytes == sizeof(DiagMailbox*), "loom_diag_mailbox: expected a pointer ({} bytes), given {} bytes",
               sizeof(DiagMailbox*), bytes);
    State& s = state();
    std::lock_guard lock(s.mu);
    if (!s.device) {
        s.pending.push_back(global);
        return;
    }
    if (const cudaError_t e = write_pointer(global, s.device); e != cudaSuccess) {
        if (is_sticky_device_error(e)) LOOM_CHECK_CUDA(e);  // the context is gone: the load fails like any call
        cudaGetLastError();
        warn_once(fmt::format("binding a module: {}", cudaGetErrorString(e)));
    }
}

}  // namespace loom::diag
