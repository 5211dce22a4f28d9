// loom._C: Loom's runtime compiler for a user's kernels (the Python side of examples/04_jit_user_kernel).
// Arguments reach the kernel as raw bytes, one bytes object per kernel parameter, packed by loom.jit.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"

namespace loom::py {

namespace nb = nanobind;
using nb::arg;
using Dim3 = std::tuple<unsigned, unsigned, unsigned>;

namespace {

jit::KernelSpec make_spec(const std::string& header, const std::string& name, std::vector<std::string> targs,
                          std::vector<std::string> defines, std::vector<std::string> include_dirs) {
    jit::KernelSpec s;
    s.header = header;
    s.name = name;
    s.template_args = std::move(targs);
    s.defines = std::move(defines);
    s.include_dirs = std::move(include_dirs);
    return s;
}

nb::dict record(const jit::CompileResult& r) {
    nb::dict d;
    d["compiler"] = r.compiler;
    d["lowered_name"] = r.lowered_name;
    d["cache_key"] = r.cache_key;
    d["log"] = r.log;
    d["from_cache"] = r.from_cache;
    d["seconds"] = r.seconds;
    d["registers"] = r.registers;
    d["spill_bytes"] = r.spill_bytes;
    d["stack_bytes"] = r.stack_bytes;
    d["smem_bytes"] = r.smem_bytes;
    d["cache_dir"] = r.cache_dir;
    return d;
}

dim3 to_dim3(const Dim3& d) { return dim3(std::get<0>(d), std::get<1>(d), std::get<2>(d)); }

}  // namespace

void bind_jit(nb::module_& m) {
    m.def("jit_current_arch", &jit::current_arch);
    m.def(
        "jit_compile",
        [](const std::string& header, const std::string& name, std::vector<std::string> targs,
           std::vector<std::string> defines, std::vector<std::string> include_dirs, int arch) {
            auto spec = make_spec(header, name, std::move(targs), std::move(defines), std::move(include_dirs));
            jit::CompileResult r;
            {
                nb::gil_scoped_release unlocked;
                r = jit::compile(spec, arch);
            }
            return record(r);
        },
        arg("header"), arg("name"), arg("template_args"), arg("defines"), arg("include_dirs"), arg("arch"),
        "compile (or read from the disk cache) for `arch` (compute capability x 10); needs no GPU");

    nb::class_<jit::Kernel>(m, "Kernel")
        .def_prop_ro("name", &jit::Kernel::name)
        .def_prop_ro("info", [](const jit::Kernel& k) { return record(k.info()); })
        .def_prop_ro("num_registers", &jit::Kernel::num_registers)
        .def(
            "launch",
            [](const jit::Kernel& k, const Dim3& grid, const Dim3& block, std::size_t smem, std::uintptr_t stream,
               const std::vector<nb::bytes>& args, const Dim3& cluster, bool cooperative) {
                std::vector<void*> ptrs;
                std::vector<std::size_t> sizes;
                ptrs.reserve(args.size() + 1);
                for (const nb::bytes& a : args) {
                    ptrs.push_back(const_cast<void*>(a.data()));
                    sizes.push_back(a.size());
                }
                ptrs.push_back(nullptr);
                jit::LaunchConfig cfg;
                cfg.grid = to_dim3(grid);
                cfg.block = to_dim3(block);
                cfg.smem = smem;
                cfg.cluster = to_dim3(cluster);
                cfg.stream = reinterpret_cast<cudaStream_t>(stream);
                cfg.cooperative = cooperative;
                nb::gil_scoped_release unlocked;  // `args` stay referenced by the caller's list
                k.launch_checked(cfg, ptrs.data(), sizes.data(), sizes.size());
            },
            arg("grid"), arg("block"), arg("smem"), arg("stream"), arg("args"), arg("cluster") = Dim3{1, 1, 1},
            arg("cooperative") = false);

    m.def(
        "jit_get_kernel",
        [](const std::string& header, const std::string& name, std::vector<std::string> targs,
           std::vector<std::string> defines, std::vector<std::string> include_dirs) -> const jit::Kernel& {
            auto spec = make_spec(header, name, std::move(targs), std::move(defines), std::move(include_dirs));
            nb::gil_scoped_release unlocked;
            return jit::get_kernel(spec);
        },
        arg("header"), arg("name"), arg("template_args"), arg("defines"), arg("include_dirs"), nb::rv_policy::reference,
        "compile-or-fetch and load for the current device; the kernel lives until exit");
}

}  // namespace loom::py
