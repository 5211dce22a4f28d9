// nvcc backend: a subprocess compile to a cubin. NVSHMEM kernels are compiled relocatable (-rdc) and linked
// with libnvshmem_device.a by nvJitLink, since NVSHMEM's device headers do not compile under NVRTC 13.0.
#include <nvJitLink.h>

#include <chrono>

#include "jit/backends.hpp"
#include "jit/subprocess.hpp"
#include "jit/toolchain.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"

namespace loom::jit::detail {
namespace {

struct Linker {
    nvJitLinkHandle h = nullptr;
    ~Linker() {
        if (h) nvJitLinkDestroy(&h);
    }
    std::string log() const {
        std::string s;
        std::size_t n = 0;
        if (nvJitLinkGetErrorLogSize(h, &n) == NVJITLINK_SUCCESS && n > 1) {
            std::string e(n, '\0');
            nvJitLinkGetErrorLog(h, e.data());
            s += e.substr(0, n - 1);
        }
        if (nvJitLinkGetInfoLogSize(h, &n) == NVJITLINK_SUCCESS && n > 1) {
            std::string i(n, '\0');
            nvJitLinkGetInfoLog(h, i.data());
            s += i.substr(0, n - 1);
        }
        return s;
    }
};

// Relocatable cubin + libnvshmem_device.a → executable cubin.
std::vector<char> link_nvshmem(const std::vector<char>& relocatable, int arch, const std::string& nvshmem_lib,
                               std::string& log) {
    Linker l;
    std::string arch_opt = "-arch=" + sm_name(arch);
    const char* opts[] = {arch_opt.c_str()};
    LOOM_CHECK_NVJITLINK(nvJitLinkCreate(&l.h, 1, opts));
    auto check = [&](nvJitLinkResult r, const char* what) {
        if (r != NVJITLINK_SUCCESS) {
            throw CompileFailure("nvjitlink", fmt::format("{} failed ({}): {}", what, static_cast<int>(r), l.log()));
        }
    };
    check(nvJitLinkAddData(l.h, NVJITLINK_INPUT_CUBIN, relocatable.data(), relocatable.size(), "kernel.cubin"),
          "nvJitLinkAddData(kernel.cubin)");
    check(nvJitLinkAddFile(l.h, NVJITLINK_INPUT_LIBRARY, nvshmem_lib.c_str()),
          fmt::format("nvJitLinkAddFile({})", nvshmem_lib).c_str());
    check(nvJitLinkComplete(l.h), "nvJitLinkComplete");
    std::size_t n = 0;
    LOOM_CHECK_NVJITLINK(nvJitLinkGetLinkedCubinSize(l.h, &n));
    std::vector<char> out(n);
    LOOM_CHECK_NVJITLINK(nvJitLinkGetLinkedCubin(l.h, out.data()));
    log += l.log();
    return out;
}

}  // namespace

Output nvcc_compile(const Job& job) {
    const auto& tc = toolchain();
    if (tc.nvcc.empty()) throw CompileFailure("nvcc", "nvcc not found: set LOOM_CUDA_HOME (or CUDA_HOME)");
    const bool nvshmem = job.spec->needs_nvshmem;
    std::string cubin_path = job.work_dir + "/kernel.cubin";
    std::vector<std::string> argv{
        tc.nvcc, "-cubin", "-arch=" + sm_name(job.arch), "-std=c++20", "-Xptxas=-v", "-DLOOM_JIT=1", "-o", cubin_path};
    if (nvshmem) argv.insert(argv.begin() + 1, "-rdc=true");
    for (const auto& d : job.include_dirs) argv.push_back("-I" + d);
    if (nvshmem) argv.push_back("-I" + nvshmem_home().home + "/include");
    for (const auto& d : job.spec->defines) argv.push_back("-D" + d);
    argv.push_back(job.tu_path);
    const auto timeout = settings().jit_timeout;
    auto r = run_process(argv, timeout);
    Output out;
    out.log = r.output;
    if (r.exit_code != 0) {
        throw CompileFailure("nvcc", fmt::format("{} exited with {}\n{}", shell_join(argv), r.exit_code, r.output));
    }
    std::string bin = read_file(cubin_path);
    out.cubin.assign(bin.begin(), bin.end());
    out.compiler = "nvcc";
    if (nvshmem) {
        out.cubin = link_nvshmem(out.cubin, job.arch, nvshmem_home().home + "/lib/libnvshmem_device.a", out.log);
        out.compiler = "nvcc+nvjitlink";
    }
    if (!job.name_expr.empty()) out.lowered_name = match_entry(cubin_entries(out.cubin), *job.spec);
    if (job.want_ptx) {
        std::vector<std::string> ptx_argv = argv;
        ptx_argv[std::find(ptx_argv.begin(), ptx_argv.end(), "-cubin") - ptx_argv.begin()] = "-ptx";
        std::string ptx_path = job.work_dir + "/kernel.ptx";
        *(std::find(ptx_argv.begin(), ptx_argv.end(), cubin_path)) = ptx_path;
        if (run_process(ptx_argv, timeout).exit_code == 0) out.ptx = read_file(ptx_path);
    }
    return out;
}

}  // namespace loom::jit::detail
