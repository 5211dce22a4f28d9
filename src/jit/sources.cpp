#include "jit/sources.hpp"

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <set>

#include "jit/sha256.hpp"
#include "jit/toolchain.hpp"
#include "loom/runtime/error.hpp"

namespace fs = std::filesystem;

namespace loom::jit::detail {

const std::string& embedded_set_hash() {
    static const std::string h = [] {
        Sha256 s;
        for (const auto& [path, text] : embedded_headers()) s.field(path).field(text);
        return s.hex();
    }();
    return h;
}

bool is_embedded(std::string_view header) {
    for (const auto& [path, text] : embedded_headers())
        if (path == header) return true;
    return false;
}

std::string embedded_include_dir() {
    // Re-checked on every call (one stat): the cache may be cleared, or settings().cache_dir changed, while running.
    static std::mutex mu;
    std::lock_guard lock(mu);
    const std::string root = cache_root() + "/headers";
    const std::string final_dir = root + "/" + embedded_set_hash().substr(0, 32);
    if (file_exists(final_dir + "/.complete")) return final_dir;
    const std::string tmp = fmt::format("{}/.tmp-{}-{}", root, ::getpid(), std::hash<std::string>()(final_dir));
    std::error_code ec;
    fs::remove_all(tmp, ec);
    for (const auto& [path, text] : embedded_headers()) {
        fs::path p = fs::path(tmp) / std::string(path);
        make_dirs(p.parent_path().string());
        write_file(p.string(), text);
    }
    write_file(tmp + "/.complete", embedded_set_hash());  // last: a directory with .complete is whole
    fs::rename(tmp, final_dir, ec);
    if (ec) {
        // Another process won the race, or an incomplete copy (a crashed writer) is in the way.
        if (!file_exists(final_dir + "/.complete")) {
            const std::string stale = fmt::format("{}.stale-{}", final_dir, ::getpid());
            fs::rename(final_dir, stale, ec);
            fs::remove_all(stale, ec);
            fs::rename(tmp, final_dir, ec);
        }
        fs::remove_all(tmp, ec);
    }
    LOOM_CHECK(file_exists(final_dir + "/.complete"), "cannot write Loom's embedded headers under {}", final_dir);
    return final_dir;
}

namespace {

// The include targets of one file, in order; comments are not stripped (over-approximation is safe).
std::vector<std::string> includes_of(const std::string& text) {
    std::vector<std::string> out;
    std::size_t pos = 0;
    while (pos < text.size()) {
        std::size_t eol = text.find('\n', pos);
        if (eol == std::string::npos) eol = text.size();
        std::size_t i = pos;
        while (i < eol && (text[i] == ' ' || text[i] == '\t')) ++i;
        if (i < eol && text[i] == '#') {
            ++i;
            while (i < eol && (text[i] == ' ' || text[i] == '\t')) ++i;
            if (text.compare(i, 7, "include") == 0) {
                i += 7;
                while (i < eol && (text[i] == ' ' || text[i] == '\t')) ++i;
                if (i < eol && (text[i] == '"' || text[i] == '<')) {
                    char close = text[i] == '"' ? '"' : '>';
                    std::size_t end = text.find(close, i + 1);
                    if (end != std::string::npos && end < eol) out.push_back(text.substr(i + 1, end - i - 1));
                }
            }
        }
        pos = eol + 1;
    }
    return out;
}

}  // namespace

std::string user_header_hash(const std::string& header, const std::vector<std::string>& include_dirs) {
    LOOM_CHECK(file_exists(header), "kernel header {} does not exist (expected an absolute path or a Loom header)",
               header);
    Sha256 s;
    std::set<std::string> seen;
    std::vector<std::string> stack{fs::weakly_canonical(header).string()};
    while (!stack.empty()) {
        std::string file = stack.back();
        stack.pop_back();
        if (!seen.insert(file).second) continue;
        std::string text = read_file(file);
        s.field(file).field(text);
        std::vector<std::string> dirs{fs::path(file).parent_path().string()};
        dirs.insert(dirs.end(), include_dirs.begin(), include_dirs.end());
        for (const auto& inc : includes_of(text)) {
            if (is_embedded(inc)) continue;
            for (const auto& d : dirs) {
                fs::path cand = fs::path(d) / inc;
                std::error_code ec;
                if (fs::is_regular_file(cand, ec)) {
                    stack.push_back(fs::weakly_canonical(cand).string());
                    break;
                }
            }
        }
    }
    return s.hex();
}

}  // namespace loom::jit::detail
