// Checks of a Chrome-trace / Perfetto JSON against the Trace Event format as the profiler writes it
// (src/runtime/profile_trace.hpp), shared by the CPU and multi-rank profiler tests.
#pragma once

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace loom_test {

// "" when `trace` is a valid trace: an object with a "traceEvents" array; every event has a known ph and an integer
// pid; every non-metadata event has a tid and a finite ts >= 0, B and i events a name; per track (pid, tid) the
// timestamps never decrease and every E closes the latest open B (no E without B, no B left open). Otherwise what
// is wrong, naming the event.
inline std::string check_trace(const nlohmann::json& trace) {
    if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
        return "expected an object with a traceEvents array";
    std::map<std::pair<long long, long long>, double> last_ts;
    std::map<std::pair<long long, long long>, std::vector<std::string>> open;
    const std::set<std::string> known = {"B", "E", "X", "i", "M"};
    std::size_t i = 0;
    for (const auto& e : trace["traceEvents"]) {
        const std::string where = fmt::format("event {} ({})", i++, e.dump());
        if (!e.contains("ph") || !e["ph"].is_string()) return where + ": no ph";
        const std::string ph = e["ph"];
        if (!known.count(ph)) return where + ": unknown ph " + ph;
        if (!e.contains("pid") || !e["pid"].is_number_integer()) return where + ": no integer pid";
        if (ph == "M") {
            if (!e.contains("name") || !e.contains("args")) return where + ": metadata without name or args";
            continue;
        }
        if (!e.contains("tid") || !e["tid"].is_number_integer()) return where + ": no integer tid";
        if (!e.contains("ts") || !e["ts"].is_number()) return where + ": no numeric ts";
        const double ts = e["ts"];
        if (!(ts >= 0)) return where + ": ts < 0";
        if ((ph == "B" || ph == "i" || ph == "X") && (!e.contains("name") || !e["name"].is_string()))
            return where + ": no name";
        if (ph == "X" && (!e.contains("dur") || !(e["dur"].get<double>() >= 0))) return where + ": X without dur >= 0";
        const std::pair<long long, long long> track{e["pid"].get<long long>(), e["tid"].get<long long>()};
        if (auto it = last_ts.find(track); it != last_ts.end() && ts < it->second)
            return where + fmt::format(": ts {} before the track's previous {}", ts, it->second);
        last_ts[track] = ts;
        if (ph == "B") open[track].push_back(e["name"]);
        if (ph == "E") {
            auto& stack = open[track];
            if (stack.empty()) return where + ": E without an open B";
            if (e.contains("name") && e["name"] != stack.back())
                return where + ": E closes " + e["name"].get<std::string>() + " but " + stack.back() + " is open";
            stack.pop_back();
        }
    }
    for (const auto& [track, stack] : open)
        if (!stack.empty())
            return fmt::format("track pid {} tid {}: {} B never closed ({})", track.first, track.second, stack.size(),
                               stack.back());
    return "";
}

// The args of every B event named `name`, per pid.
inline std::map<int, std::vector<nlohmann::json>> span_args(const nlohmann::json& trace, const std::string& name) {
    std::map<int, std::vector<nlohmann::json>> out;
    for (const auto& e : trace["traceEvents"])
        if (e["ph"] == "B" && e["name"] == name) out[e["pid"].get<int>()].push_back(e["args"]);
    return out;
}

}  // namespace loom_test
