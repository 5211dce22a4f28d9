// loom-info: what this machine offers Loom. `--has-gpu` exits 0 when a GPU is usable, else prints why and exits 1.
// Default output: Loom's version, the driver and runtime versions, each visible GPU (name, compute capability, SMs,
// memory, L2), the P2P access matrix, whether an MPS control daemon is running, where NVSHMEM is, and Loom's settings
// as this process reads them from the environment (or the error naming a malformed variable).
#include <cuda_runtime_api.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/version.hpp"

namespace fs = std::filesystem;

namespace {

std::string version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// MPS: the control daemon listens on <pipe dir>/control (CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps).
// A connectable socket means a daemon is running; clients of this process would then go through MPS.
std::string mps_status() {
    const char* env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
    std::string dir = env && *env ? env : "/tmp/nvidia-mps";
    std::string control = dir + "/control";
    std::error_code ec;
    if (!fs::exists(control, ec)) return "not running (no " + control + ")";
    int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, control.c_str(), sizeof(addr.sun_path) - 1);
    bool up = s >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (s >= 0) ::close(s);
    return up ? "active (control daemon at " + dir + ")" : "stale pipe directory " + dir + " (daemon not answering)";
}

std::string capture(const char* cmd) {
    std::string out;
    if (FILE* p = ::popen(cmd, "r")) {
        char buf[512];
        while (std::fgets(buf, sizeof buf, p)) out += buf;
        ::pclose(p);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
}

// The process's settings, or null with `error` set when a variable is malformed.
const loom::Settings* settings_or_null(std::string& error) {
    try {
        return &loom::settings();
    } catch (const loom::Error& e) {
        error = e.what();
        return nullptr;
    }
}

std::string nvshmem_status() {
    std::string home, error;
    if (const loom::Settings* s = settings_or_null(error)) home = s->nvshmem_home;
    if (home.empty()) home = capture("python3 -c 'import nvidia.nvshmem as n; print(list(n.__path__)[0])' 2>/dev/null");
    if (home.empty()) return "not found (pip install nvidia-nvshmem-cu13==3.4.5, or set LOOM_NVSHMEM_HOME)";
    std::error_code ec;
    bool host = fs::exists(fs::path(home) / "lib/libnvshmem_host.so.3", ec);
    bool dev = fs::exists(fs::path(home) / "lib/libnvshmem_device.a", ec);
    return home + (host && dev ? " (host and device libraries present)"
                   : host      ? " (libnvshmem_device.a missing)"
                               : " (libnvshmem_host.so.3 missing)");
}

std::string bytes(std::size_t n) {
    if (n % (std::size_t{1} << 30) == 0) return std::to_string(n >> 30) + " GiB";
    if (n % (std::size_t{1} << 20) == 0) return std::to_string(n >> 20) + " MiB";
    return std::to_string(n) + " bytes";
}

std::string ms(std::chrono::milliseconds t) { return t.count() ? std::to_string(t.count()) + " ms" : "none"; }

void print_settings() {
    std::string error;
    const loom::Settings* s = settings_or_null(error);
    if (!s) {
        std::printf("settings: %s\n", error.c_str());
        return;
    }
    const loom::RankInfo& r = s->rank;
    const std::string device = r.device >= 0 ? std::to_string(r.device) : "local rank % GPUs";
    std::printf("settings:\n");
    std::printf("  rank %d of %d (%s), local %d of %d, rendezvous %s:%d, device %s\n", r.rank, r.world_size,
                r.source.c_str(), r.local_rank, r.local_world_size, r.master_addr.c_str(), r.master_port,
                device.c_str());
    std::printf("  symmetric heap %s\n", bytes(s->symmetric_size).c_str());
    std::printf("  wait timeout %s, store timeout %s\n", ms(s->wait_timeout).c_str(), ms(s->store_timeout).c_str());
    std::printf("  JIT compiler %s, cache %s, CUDA %s, autotune %s\n", loom::to_string(s->jit_compiler),
                s->cache_dir.c_str(), s->cuda_home.empty() ? "(build-time toolkit)" : s->cuda_home.c_str(),
                s->autotune ? "on" : "off");
    std::printf("  log level %s\n", loom::to_string(s->log_level));
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"loom-info: what this machine offers Loom (GPUs, P2P, MPS, NVSHMEM, settings)"};
    bool has_gpu_only = false;
    app.add_flag("--has-gpu", has_gpu_only, "exit 0 when a GPU is usable, else print why and exit 1");
    app.set_version_flag("--version", std::string("loom-info ") + loom::version());
    CLI11_PARSE(app, argc, argv);
    if (!has_gpu_only) std::printf("Loom %s\n", loom::version());
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        if (!has_gpu_only) {
            std::printf("NVSHMEM: %s\n", nvshmem_status().c_str());
            print_settings();
        }
        return 1;
    }
    if (has_gpu_only) {
        std::printf("GPU present\n");
        return 0;
    }
    int drv = 0, rt = 0, count = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    cudaGetDeviceCount(&count);
    std::printf("CUDA driver %s, runtime %s, %d visible GPU(s)\n", version(drv).c_str(), version(rt).c_str(), count);
    for (int d = 0; d < count; ++d) {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
            std::printf("  GPU %d: properties unavailable\n", d);
            continue;
        }
        std::printf("  GPU %d: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.1f MiB, bus %04x:%02x:%02x\n", d, p.name, p.major,
                    p.minor, p.multiProcessorCount, p.totalGlobalMem / double(1ull << 30),
                    p.l2CacheSize / double(1 << 20), p.pciDomainID, p.pciBusID, p.pciDeviceID);
    }
    if (count > 1) {
        std::printf("P2P access (row can access column):\n     ");
        for (int j = 0; j < count; ++j) std::printf(" %3d", j);
        std::printf("\n");
        for (int i = 0; i < count; ++i) {
            std::printf("  %3d", i);
            for (int j = 0; j < count; ++j) {
                int can = 0;
                if (i != j) cudaDeviceCanAccessPeer(&can, i, j);
                std::printf(" %3s", i == j ? "-" : can ? "yes" : "no");
            }
            std::printf("\n");
        }
    } else {
        std::printf("P2P access: one GPU (ranks sharing it reach each other's memory directly)\n");
    }
    std::printf("MPS: %s\n", mps_status().c_str());
    std::printf("NVSHMEM: %s\n", nvshmem_status().c_str());
    print_settings();
    return 0;
}
