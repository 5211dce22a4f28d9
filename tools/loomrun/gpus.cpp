#include "gpus.hpp"

#include <dirent.h>
#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <set>
#include <stdexcept>

namespace loomrun {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::size_t pos = 0;
    while (true) {
        std::size_t next = s.find(sep, pos);
        std::string item = s.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
        while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
        while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(0, 1);
        out.push_back(item);
        if (next == std::string::npos) return out;
        pos = next + 1;
    }
}

bool all_digits(const std::string& s) {
    if (s.empty() || s.size() > 6) return false;
    for (char c : s)
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    return true;
}

}  // namespace

int physical_gpu_count() {
    if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
        int n = 0;
        while (dirent* e = ::readdir(d))
            if (e->d_name[0] != '.') ++n;
        ::closedir(d);
        if (n > 0) return n;
    }
    // nvidia-smi talks to the driver through NVML, not CUDA.
    FILE* p = ::popen("nvidia-smi -L 2>/dev/null", "r");
    if (!p) return 0;
    int n = 0;
    char line[512];
    while (std::fgets(line, sizeof(line), p))
        if (std::string(line).rfind("GPU ", 0) == 0) ++n;
    ::pclose(p);
    return n;
}

int visible_gpu_count(int physical, const char* cvd) {
    if (!cvd) return physical;
    int n = 0;
    std::set<int> seen;
    for (const auto& item : split(cvd, ',')) {
        if (all_digits(item)) {
            int i = std::stoi(item);
            if (i >= physical || seen.count(i)) break;  // CUDA ignores everything from an invalid entry on
            seen.insert(i);
        } else if (item.rfind("GPU-", 0) != 0 && item.rfind("MIG-", 0) != 0) {
            break;
        }
        ++n;
    }
    return std::min(n, physical);
}

std::vector<int> gpu_list(const std::string& option, int visible) {
    std::vector<int> out;
    if (option.empty()) {
        for (int i = 0; i < visible; ++i) out.push_back(i);
        return out;
    }
    for (const auto& item : split(option, ',')) {
        if (!all_digits(item))
            throw std::runtime_error(
                fmt::format("--gpus: expected a comma-separated list of device indices like "
                            "\"0,1\", given \"{}\"",
                            option));
        int i = std::stoi(item);
        if (i >= visible)
            throw std::runtime_error(
                fmt::format("--gpus: device {} is not visible (expected indices below {}, the "
                            "number of visible GPUs{})",
                            i, visible, visible == 0 ? "; no GPU was found" : ""));
        out.push_back(i);
    }
    return out;
}

}  // namespace loomrun
