// The compilers behind loom::jit::compile: NVRTC (to a cubin, or to PTX assembled by a `ptxas` subprocess)
// and nvcc (subprocess; relocatable + nvJitLink with libnvshmem_device for NVSHMEM kernels).
//
// Each backend turns one Job into a cubin or throws CompileFailure carrying the compiler's log; jit.cpp
// decides on fallbacks and turns failures into loom::Error.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "loom/jit/jit.hpp"

namespace loom::jit::detail {

struct Job {
    const KernelSpec* spec = nullptr;
    int arch = 90;
    std::string tu;                         // the generated translation unit
    std::string tu_path;                    // where it is written (the name NVRTC reports, the file nvcc compiles)
    std::string work_dir;                   // scratch directory for subprocess outputs
    std::vector<std::string> include_dirs;  // -I, in order (embedded set, user dirs, CUDA)
    std::string name_expr;                  // "ns::kernel<1, 2>", or "" when the TU only includes the header
    bool want_ptx = false;                  // also return PTX text (LOOM_LOG_LEVEL=debug)
};

struct Output {
    std::vector<char> cubin;
    std::string ptx;
    std::string lowered_name;
    std::string log;       // compiler/assembler/linker output (ptxas -v included)
    std::string compiler;  // "nvrtc", "nvrtc-ptxas", "nvcc", "nvcc+nvjitlink"
};

class CompileFailure : public std::runtime_error {
  public:
    CompileFailure(std::string compiler, std::string log)
        : std::runtime_error(compiler + " failed"), compiler_(std::move(compiler)), log_(std::move(log)) {}
    const std::string& compiler() const { return compiler_; }
    const std::string& log() const { return log_; }

  private:
    std::string compiler_, log_;
};

// "sm_90a" for 90 (wgmma and setmaxnreg need the arch-specific target), "sm_80", "sm_89", ...
std::string sm_name(int arch);

Output nvrtc_compile(const Job& job, bool via_ptxas);
Output nvcc_compile(const Job& job);

// Entry kernels (mangled names) in a cubin's ELF symbol table.
std::vector<std::string> cubin_entries(const std::vector<char>& cubin);
// The entry among `entries` that is `name<args>`, found by demangling; raises listing the candidates.
std::string match_entry(const std::vector<std::string>& entries, const KernelSpec& spec);

struct Resources {
    int registers = -1;
    int stack_bytes = -1;
    int spill_store_bytes = -1;
    int spill_load_bytes = -1;
    int smem_bytes = -1;
    std::string report;  // the ptxas lines for the entry
};
// Parses `ptxas -v` output for the entry `lowered` (or the first entry when `lowered` is absent).
Resources parse_ptxas_verbose(const std::string& log, const std::string& lowered);

}  // namespace loom::jit::detail
