#include "jit/toolchain.hpp"

#include <nvrtc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "jit/subprocess.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"

#ifndef LOOM_CUDA_INCLUDE_DIR
#define LOOM_CUDA_INCLUDE_DIR ""
#endif
#ifndef LOOM_NVCC_PATH
#define LOOM_NVCC_PATH ""
#endif
#ifndef LOOM_NVSHMEM_HOME_DEFAULT
#define LOOM_NVSHMEM_HOME_DEFAULT ""
#endif

namespace fs = std::filesystem;

namespace loom::jit::detail {

bool file_exists(const std::string& path) {
    struct stat st {};
    return !path.empty() && ::stat(path.c_str(), &st) == 0;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    LOOM_CHECK(in.good(), "cannot read {}: {}", path, std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_file(const std::string& path, std::string_view data) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    LOOM_CHECK(out.good(), "cannot write {}: {}", path, std::strerror(errno));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.flush();
    LOOM_CHECK(out.good(), "cannot write {}: {}", path, std::strerror(errno));
}

void make_dirs(const std::string& path) {
    std::error_code ec;
    fs::create_directories(path, ec);
    LOOM_CHECK(!ec && fs::is_directory(path), "cannot create directory {}: {}", path, ec.message());
}

namespace {

std::string first_existing(std::initializer_list<std::string> paths) {
    for (const auto& p : paths)
        if (file_exists(p)) return p;
    return "";
}

// The build-time include dir may be a CMake list; its first entry's parent is the toolkit (or targets/<arch>).
std::string home_from_build_include() {
    std::string inc = LOOM_CUDA_INCLUDE_DIR;
    if (auto semi = inc.find(';'); semi != std::string::npos) inc = inc.substr(0, semi);
    if (inc.empty()) return "";
    fs::path p = fs::path(inc).parent_path();
    // /usr/local/cuda/targets/x86_64-linux/include -> /usr/local/cuda
    if (p.parent_path().filename() == "targets") p = p.parent_path().parent_path();
    return p.string();
}

std::string which(const std::string& tool) {
    const char* path = std::getenv("PATH");
    if (!path) return "";
    std::stringstream ss(path);
    std::string dir;
    while (std::getline(ss, dir, ':')) {
        std::string cand = dir + "/" + tool;
        if (!dir.empty() && ::access(cand.c_str(), X_OK) == 0) return cand;
    }
    return "";
}

Toolchain locate() {
    Toolchain t;
    t.cuda_home = settings().cuda_home;
    if (t.cuda_home.empty()) t.cuda_home = home_from_build_include();
    if (!t.cuda_home.empty()) {
        for (const std::string& d : {t.cuda_home + "/include", t.cuda_home + "/include/cccl"})
            if (file_exists(d)) t.cuda_include_dirs.push_back(d);
    }
    if (t.cuda_include_dirs.empty()) {
        std::string inc = LOOM_CUDA_INCLUDE_DIR;
        std::stringstream ss(inc);
        std::string d;
        while (std::getline(ss, d, ';')) {
            if (file_exists(d)) t.cuda_include_dirs.push_back(d);
            if (file_exists(d + "/cccl")) t.cuda_include_dirs.push_back(d + "/cccl");
        }
    }
    auto tool = [&](const char* name, const std::string& build_time) {
        std::string home_bin = t.cuda_home.empty() ? "" : t.cuda_home + "/bin/" + name;
        std::string found = first_existing({home_bin, build_time});
        return found.empty() ? which(name) : found;
    };
    t.nvcc = tool("nvcc", LOOM_NVCC_PATH);
    std::string nvcc_dir = t.nvcc.empty() ? "" : fs::path(t.nvcc).parent_path().string();
    t.ptxas = tool("ptxas", nvcc_dir.empty() ? "" : nvcc_dir + "/ptxas");
    t.cuobjdump = tool("cuobjdump", nvcc_dir.empty() ? "" : nvcc_dir + "/cuobjdump");
    int major = 0, minor = 0;
    LOOM_CHECK_NVRTC(nvrtcVersion(&major, &minor));
    t.nvrtc_version = fmt::format("{}.{}", major, minor);
    return t;
}

std::string nvshmem_version_of(const std::string& home) {
    std::string text = read_file(home + "/include/non_abi/nvshmem_version.h");
    auto grab = [&](const char* macro) {
        auto p = text.find(macro);
        if (p == std::string::npos) return std::string("?");
        p += std::strlen(macro);
        while (p < text.size() && (text[p] == ' ' || text[p] == '\t')) ++p;
        auto e = p;
        while (e < text.size() && std::isdigit(static_cast<unsigned char>(text[e]))) ++e;
        return text.substr(p, e - p);
    };
    return fmt::format("{}.{}.{}", grab("NVSHMEM_VENDOR_MAJOR_VERSION"), grab("NVSHMEM_VENDOR_MINOR_VERSION"),
                       grab("NVSHMEM_VENDOR_PATCH_VERSION"));
}

}  // namespace

const Toolchain& toolchain() {
    static const Toolchain t = locate();
    return t;
}

const std::string& nvcc_version() {
    static std::once_flag once;
    static std::string version;
    std::call_once(once, [] {
        const auto& t = toolchain();
        LOOM_CHECK(!t.nvcc.empty(), "nvcc not found: set LOOM_CUDA_HOME (looked in $CUDA_HOME/bin, {}, PATH)",
                   LOOM_NVCC_PATH);
        auto r = run_process({t.nvcc, "--version"}, std::chrono::seconds(60));
        LOOM_CHECK(r.exit_code == 0, "{} --version failed: {}", t.nvcc, r.output);
        auto p = r.output.rfind(", V");
        version = p == std::string::npos ? r.output : r.output.substr(p + 2, r.output.find('\n', p) - p - 2);
    });
    return version;
}

std::string driver_version() {
    if (!driver::available()) return "";
    int v = 0;
    if (driver::api().cuDriverGetVersion(&v) != CUDA_SUCCESS) return "";
    return std::to_string(v);
}

const NvshmemHome& nvshmem_home() {
    static std::once_flag once;
    static NvshmemHome h;
    static std::string error;
    std::call_once(once, [] {
        std::vector<std::string> tried;
        auto ok = [&](const std::string& home) {
            if (home.empty()) return false;
            tried.push_back(home);
            return file_exists(home + "/include/nvshmem.h") && file_exists(home + "/lib");
        };
        std::string home;
        if (const std::string& v = settings().nvshmem_home; ok(v)) {
            home = v;
        } else if (ok(LOOM_NVSHMEM_HOME_DEFAULT)) {
            home = LOOM_NVSHMEM_HOME_DEFAULT;
        } else {
            try {
                auto r = run_process({"python3", "-c", "import nvidia.nvshmem as n; print(list(n.__path__)[0])"},
                                     std::chrono::seconds(60));
                std::string p = r.output.substr(0, r.output.find('\n'));
                if (r.exit_code == 0 && ok(p)) home = p;
            } catch (const Error&) {
            }
            tried.push_back("python3 -c 'import nvidia.nvshmem'");
        }
        if (home.empty()) {
            std::string list;
            for (const auto& t : tried) list += (list.empty() ? "" : ", ") + t;
            error = fmt::format(
                "NVSHMEM not found (expected include/nvshmem.h and lib/ under LOOM_NVSHMEM_HOME, the build-time "
                "LOOM_NVSHMEM_HOME or the nvidia-nvshmem-cu13 wheel; tried: {})",
                list.empty() ? "nothing" : list);
            return;
        }
        h.home = home;
        h.version = nvshmem_version_of(home);
    });
    LOOM_CHECK(!h.home.empty(), "{}", error);
    return h;
}

std::string cache_root() {
    const std::string& root = settings().cache_dir;
    make_dirs(root);
    return root;
}

}  // namespace loom::jit::detail
