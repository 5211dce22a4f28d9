// NVRTC backend: the in-process compiler (no GPU needed), optionally stopping at PTX for a ptxas subprocess.
#include <nvrtc.h>

#include <chrono>
#include <memory>

#include "jit/backends.hpp"
#include "jit/subprocess.hpp"
#include "jit/toolchain.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"

namespace loom::jit::detail {

std::string sm_name(int arch) {
    LOOM_CHECK(arch >= 50 && arch <= 130, "expected a compute capability times ten (80, 89, 90, ...), given {}", arch);
    return arch == 90 ? "sm_90a" : fmt::format("sm_{}", arch);
}

namespace {

std::string compute_name(int arch) {
    std::string sm = sm_name(arch);
    return "compute_" + sm.substr(3);
}

struct Program {
    nvrtcProgram p = nullptr;
    ~Program() {
        if (p) nvrtcDestroyProgram(&p);
    }
};

std::string program_log(nvrtcProgram p) {
    std::size_t n = 0;
    if (nvrtcGetProgramLogSize(p, &n) != NVRTC_SUCCESS || n <= 1) return "";
    std::string log(n, '\0');
    nvrtcGetProgramLog(p, log.data());
    log.resize(n - 1);
    return log;
}

// One NVRTC compilation for `target` ("sm_90a" → cubin, "compute_90a" → PTX).
Output run_nvrtc(const Job& job, const std::string& target, bool cubin) {
    Program prog;
    LOOM_CHECK_NVRTC(nvrtcCreateProgram(&prog.p, job.tu.c_str(), job.tu_path.c_str(), 0, nullptr, nullptr));
    std::string expr = job.name_expr.empty() ? "" : "&" + job.name_expr;
    if (!expr.empty()) LOOM_CHECK_NVRTC(nvrtcAddNameExpression(prog.p, expr.c_str()));
    std::vector<std::string> opts{"-arch=" + target, "-std=c++20", "-default-device", "-DLOOM_JIT=1"};
    if (cubin) opts.push_back("--ptxas-options=-v");
    for (const auto& d : job.include_dirs) opts.push_back("-I" + d);
    for (const auto& d : job.spec->defines) opts.push_back("-D" + d);
    std::vector<const char*> argv;
    for (const auto& o : opts) argv.push_back(o.c_str());
    nvrtcResult rc = nvrtcCompileProgram(prog.p, static_cast<int>(argv.size()), argv.data());
    Output out;
    out.log = program_log(prog.p);
    if (rc != NVRTC_SUCCESS) {
        throw CompileFailure("nvrtc", fmt::format("nvrtcCompileProgram: {}\noptions: {}\n{}", nvrtcGetErrorString(rc),
                                                  shell_join(opts), out.log));
    }
    if (!expr.empty()) {
        const char* lowered = nullptr;
        LOOM_CHECK_NVRTC(nvrtcGetLoweredName(prog.p, expr.c_str(), &lowered));
        out.lowered_name = lowered;
    }
    std::size_t n = 0;
    if (cubin) {
        LOOM_CHECK_NVRTC(nvrtcGetCUBINSize(prog.p, &n));
        out.cubin.resize(n);
        LOOM_CHECK_NVRTC(nvrtcGetCUBIN(prog.p, out.cubin.data()));
    } else {
        LOOM_CHECK_NVRTC(nvrtcGetPTXSize(prog.p, &n));
        out.ptx.resize(n);
        LOOM_CHECK_NVRTC(nvrtcGetPTX(prog.p, out.ptx.data()));
        if (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
    }
    return out;
}

}  // namespace

Output nvrtc_compile(const Job& job, bool via_ptxas) {
    if (!via_ptxas) {
        Output out = run_nvrtc(job, sm_name(job.arch), /*cubin=*/true);
        out.compiler = "nvrtc";
        if (job.want_ptx) {
            try {
                out.ptx = run_nvrtc(job, compute_name(job.arch), /*cubin=*/false).ptx;
            } catch (const CompileFailure&) {
                // The cubin compiled; a PTX dump is best effort.
            }
        }
        return out;
    }
    // NVRTC → PTX, then the ptxas subprocess: a crash in the assembler then cannot take the process down.
    Output out = run_nvrtc(job, compute_name(job.arch), /*cubin=*/false);
    out.compiler = "nvrtc-ptxas";
    const auto& tc = toolchain();
    if (tc.ptxas.empty()) throw CompileFailure("nvrtc-ptxas", "ptxas not found: set LOOM_CUDA_HOME");
    std::string ptx_path = job.work_dir + "/kernel.ptx", cubin_path = job.work_dir + "/kernel.cubin";
    write_file(ptx_path, out.ptx);
    std::vector<std::string> argv{tc.ptxas, "-arch=" + sm_name(job.arch), "-v", "-o", cubin_path, ptx_path};
    const auto timeout = settings().jit_timeout;
    auto r = run_process(argv, timeout);
    out.log += r.output;
    if (r.exit_code != 0) {
        throw CompileFailure("ptxas", fmt::format("{} exited with {}\n{}", shell_join(argv), r.exit_code, r.output));
    }
    std::string bin = read_file(cubin_path);
    out.cubin.assign(bin.begin(), bin.end());
    return out;
}

}  // namespace loom::jit::detail
