#include "procs.hpp"

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace loomrun {
namespace {

// The state letter and start time from /proc/<pid>/stat. The command name (field 2) is in parentheses and may hold
// spaces or ')', so the fields are counted after its last ')'.
bool read_stat(pid_t pid, char* state, unsigned long long* start) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(f, line)) return false;
    auto close = line.rfind(')');
    if (close == std::string::npos) return false;
    std::istringstream rest(line.substr(close + 1));
    std::string field;
    for (int i = 3; i <= 22; ++i) {  // field 3 is the state, field 22 the start time
        if (!(rest >> field)) return false;
        if (i == 3) *state = field[0];
    }
    char* end = nullptr;
    *start = std::strtoull(field.c_str(), &end, 10);
    return end && *end == '\0';
}

}  // namespace

std::optional<ProcId> live_process(pid_t pid) {
    char state = 0;
    unsigned long long start = 0;
    if (pid <= 0 || !read_stat(pid, &state, &start) || state == 'Z' || state == 'X') return std::nullopt;
    return ProcId{pid, start};
}

bool still_running(const ProcId& id) {
    auto now = live_process(id.pid);
    return now && now->start == id.start;
}

std::string to_text(const ProcId& id) { return std::to_string(id.pid) + " " + std::to_string(id.start); }

std::optional<ProcId> proc_id_from_text(const std::string& text) {
    std::istringstream in(text);
    long long pid = 0;
    unsigned long long start = 0;
    if (!(in >> pid >> start) || pid <= 0) return std::nullopt;
    return ProcId{static_cast<pid_t>(pid), start};
}

std::vector<pid_t> children_of(pid_t pid) {
    std::vector<pid_t> out;
    const std::string task = "/proc/" + std::to_string(pid) + "/task";
    DIR* d = ::opendir(task.c_str());
    if (!d) return out;
    while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::ifstream f(task + "/" + e->d_name + "/children");
        for (long long c; f >> c;) out.push_back(static_cast<pid_t>(c));
    }
    ::closedir(d);
    return out;
}

}  // namespace loomrun
