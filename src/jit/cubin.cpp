// Reading cubins: the entry kernels of the ELF symbol table, demangled-name matching (for nvcc, which has
// no name expressions), and `ptxas -v` resource lines.
#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <regex>

#include "jit/backends.hpp"
#include "loom/runtime/error.hpp"

namespace loom::jit::detail {
namespace {

template <class T>
T load(const std::vector<char>& b, std::size_t off) {
    LOOM_CHECK(off + sizeof(T) <= b.size(), "malformed cubin: read at {} past its {} bytes", off, b.size());
    T v;
    std::memcpy(&v, b.data() + off, sizeof(T));
    return v;
}

std::string demangle(const std::string& mangled) {
    int status = 0;
    char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
    if (status != 0 || !d) return mangled;
    std::string s(d);
    std::free(d);
    return s;
}

// "(int)3" → "3", "3u" → "3", "true" stays; spaces removed.
std::string normalize_args(std::string s) {
    s = std::regex_replace(s, std::regex(R"(\((?:unsigned |signed )?[A-Za-z_:][A-Za-z_:0-9 ]*\)(-?[0-9]))"), "$1");
    s = std::regex_replace(s, std::regex(R"(\b(-?[0-9]+)(?:ull|ul|ll|u|l)\b)", std::regex::icase), "$1");
    std::string out;
    for (char c : s)
        if (c != ' ') out += c;
    return out;
}

}  // namespace

std::vector<std::string> cubin_entries(const std::vector<char>& b) {
    LOOM_CHECK(b.size() >= 64 &&
                   std::memcmp(b.data(),
                               "\x7f"
                               "ELF",
                               4) == 0 &&
                   b[4] == 2,
               "expected a 64-bit ELF cubin, given {} bytes", b.size());
    auto shoff = load<std::uint64_t>(b, 0x28);
    auto shentsize = load<std::uint16_t>(b, 0x3A);
    auto shnum = load<std::uint16_t>(b, 0x3C);
    std::vector<std::string> out;
    for (std::uint16_t i = 0; i < shnum; ++i) {
        std::size_t sh = shoff + std::size_t(i) * shentsize;
        if (load<std::uint32_t>(b, sh + 4) != 2) continue;  // SHT_SYMTAB
        auto off = load<std::uint64_t>(b, sh + 0x18), size = load<std::uint64_t>(b, sh + 0x20);
        auto link = load<std::uint32_t>(b, sh + 0x28);
        auto entsize = load<std::uint64_t>(b, sh + 0x38);
        std::size_t strsh = shoff + std::size_t(link) * shentsize;
        auto stroff = load<std::uint64_t>(b, strsh + 0x18), strsize = load<std::uint64_t>(b, strsh + 0x20);
        LOOM_CHECK(entsize >= 24 && stroff + strsize <= b.size(), "malformed cubin symbol table");
        for (std::uint64_t s = off; s + entsize <= off + size; s += entsize) {
            auto name = load<std::uint32_t>(b, s);
            auto info = load<std::uint8_t>(b, s + 4);
            auto other = load<std::uint8_t>(b, s + 5);
            // STT_FUNC with STO_CUDA_ENTRY (0x10): a __global__ function.
            if ((info & 0xf) != 2 || (other & 0x10) == 0 || name >= strsize) continue;
            out.emplace_back(b.data() + stroff + name);
        }
    }
    return out;
}

std::string match_entry(const std::vector<std::string>& entries, const KernelSpec& spec) {
    std::string want_args;
    for (std::size_t i = 0; i < spec.template_args.size(); ++i) want_args += (i ? "," : "") + spec.template_args[i];
    want_args = normalize_args(want_args);
    std::vector<std::string> by_name, exact;
    std::string listing;
    for (const auto& e : entries) {
        std::string d = demangle(e);
        listing += fmt::format("\n  {} ({})", d, e);
        // "void ns::k<3>(float*)" or "ns::k(float*)": the qualified name starts a word and is followed by '<'/'('.
        std::size_t p = d.find(spec.name);
        while (p != std::string::npos && p > 0 && d[p - 1] != ' ') p = d.find(spec.name, p + 1);
        if (p == std::string::npos) continue;
        std::size_t after = p + spec.name.size();
        if (after >= d.size() || (d[after] != '<' && d[after] != '(')) continue;
        by_name.push_back(e);
        if (d[after] == '<') {
            int depth = 0;
            std::size_t q = after;
            for (; q < d.size(); ++q) {
                if (d[q] == '<') ++depth;
                if (d[q] == '>' && --depth == 0) break;
            }
            if (normalize_args(d.substr(after + 1, q - after - 1)) == want_args) exact.push_back(e);
        } else if (want_args.empty()) {
            exact.push_back(e);
        }
    }
    if (exact.size() == 1) return exact[0];
    if (exact.empty() && by_name.size() == 1) return by_name[0];  // one instantiation: argument spelling differs
    LOOM_FAIL("cannot identify kernel {} in the compiled cubin: expected one entry named so, found {}:{}",
              spec.display(), exact.size() > 1 ? exact.size() : by_name.size(),
              listing.empty() ? " (no entry kernels)" : listing);
}

Resources parse_ptxas_verbose(const std::string& log, const std::string& lowered) {
    Resources r;
    static const std::string marker = "Compiling entry function '";
    std::size_t start = std::string::npos;
    if (!lowered.empty()) start = log.find(marker + lowered + "'");
    if (start == std::string::npos) start = log.find(marker);
    if (start == std::string::npos) {
        // nvJitLink/ptxas may print only "Function properties for" blocks.
        start = lowered.empty() ? log.find("Function properties for") : log.find("Function properties for " + lowered);
        if (start == std::string::npos) return r;
    }
    std::size_t end = log.find(marker, start + marker.size());
    std::string block = log.substr(start, end == std::string::npos ? std::string::npos : end - start);
    auto grab = [&](const char* pattern) {
        std::smatch m;
        return std::regex_search(block, m, std::regex(pattern)) ? std::atoi(m[1].str().c_str()) : -1;
    };
    r.registers = grab(R"(Used (\d+) registers)");
    r.stack_bytes = grab(R"((\d+) bytes stack frame)");
    r.spill_store_bytes = grab(R"((\d+) bytes spill stores)");
    r.spill_load_bytes = grab(R"((\d+) bytes spill loads)");
    r.smem_bytes = grab(R"((\d+) bytes smem)");
    if (r.registers >= 0 && r.smem_bytes < 0) r.smem_bytes = 0;  // ptxas omits smem when there is none
    std::string report;
    std::size_t pos = 0;
    while (pos < block.size()) {
        std::size_t eol = block.find('\n', pos);
        std::string line = block.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
        if (!line.empty() && line.find_first_not_of(" \t\r") != std::string::npos) report += line + "\n";
        if (eol == std::string::npos) break;
        pos = eol + 1;
    }
    r.report = report;
    return r;
}

}  // namespace loom::jit::detail
