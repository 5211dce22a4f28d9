#include "runtime/call_agreement.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"

namespace loom::detail {

namespace {

thread_local int agreed_depth = 0;

void put(Bytes& b, const std::string& s) {
    const auto n = static_cast<std::uint32_t>(s.size());
    const auto* p = reinterpret_cast<const std::uint8_t*>(&n);
    b.insert(b.end(), p, p + sizeof n);
    b.insert(b.end(), s.begin(), s.end());
}

std::string take(const Bytes& b, std::size_t& at) {
    std::uint32_t n = 0;
    LOOM_CHECK(b.size() - at >= sizeof n, "call agreement: a peer's verdict is truncated ({} bytes)", b.size());
    std::memcpy(&n, b.data() + at, sizeof n);
    at += sizeof n;
    LOOM_CHECK(b.size() - at >= n, "call agreement: a peer's verdict is truncated ({} bytes)", b.size());
    std::string s(reinterpret_cast<const char*>(b.data() + at), n);
    at += n;
    return s;
}

std::string rank_list(const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s;
}

// Rank r's value of `field` ("op": the op), or "(absent)".
std::string value_of(const CallVerdict& v, const std::string& field) {
    if (field == "op") return v.sig.op();
    for (const auto& [k, x] : v.sig.fields())
        if (k == field) return x;
    return "(absent)";
}

// The message for `field` when the ranks do not all give the same value, else "".
std::string differ_on(const std::vector<CallVerdict>& all, const std::string& field) {
    std::map<std::string, std::vector<int>> by_value;
    for (std::size_t r = 0; r < all.size(); ++r) by_value[value_of(all[r], field)].push_back(static_cast<int>(r));
    if (by_value.size() <= 1) return "";
    auto most = by_value.begin();
    for (auto it = by_value.begin(); it != by_value.end(); ++it)
        if (it->second.size() > most->second.size() ||
            (it->second.size() == most->second.size() && it->second.front() < most->second.front()))
            most = it;
    // "rank 2 gives 128", "ranks 0, 1, 3 give 64"; "calls" for the op.
    auto side = [&](const std::vector<int>& ranks, const std::string& value) {
        const bool one = ranks.size() == 1;
        return fmt::format("{} {} {}", rank_list(ranks),
                           field == "op" ? (one ? "calls" : "call") : (one ? "gives" : "give"), value);
    };
    std::string odd;
    for (const auto& [value, ranks] : by_value)
        if (value != most->first) odd += side(ranks, value) + "; ";
    return fmt::format(
        "{}: the ranks disagree on {}: {}{} (every rank must make the same call: same op, counts, dtypes, options and "
        "symmetric buffers; checked because LOOM_CHECK_AGREEMENT is on)",
        all[most->second.front()].sig.op(), field == "op" ? "the op" : field, odd, side(most->second, most->first));
}

}  // namespace

CallSignature& CallSignature::add(std::string field, std::string value) {
    fields_.emplace_back(std::move(field), std::move(value));
    return *this;
}

Bytes encode(const CallVerdict& v) {
    Bytes b;
    put(b, v.sig.op());
    put(b, v.error);
    put(b, std::to_string(v.sig.fields().size()));
    for (const auto& [k, x] : v.sig.fields()) {
        put(b, k);
        put(b, x);
    }
    return b;
}

CallVerdict decode(const Bytes& b) {
    std::size_t at = 0;
    CallVerdict v;
    v.sig = CallSignature(take(b, at));
    v.error = take(b, at);
    const std::string n = take(b, at);
    const unsigned long count = std::strtoul(n.c_str(), nullptr, 10);
    LOOM_CHECK(count <= b.size(), "call agreement: a peer's verdict is malformed");
    for (unsigned long i = 0; i < count; ++i) {
        std::string k = take(b, at);
        v.sig.add(std::move(k), take(b, at));
    }
    return v;
}

std::string disagreement(const std::vector<CallVerdict>& all) {
    for (std::size_t r = 0; r < all.size(); ++r)
        if (!all[r].error.empty())
            return fmt::format(
                "{}: rank {}'s arguments were refused: {} (checked on every rank because "
                "LOOM_CHECK_AGREEMENT is on)",
                all[r].sig.op(), r, all[r].error);
    std::vector<std::string> fields{"op"};
    for (const CallVerdict& v : all)
        for (const auto& [k, x] : v.sig.fields())
            if (std::find(fields.begin(), fields.end(), k) == fields.end()) fields.push_back(k);
    for (const std::string& f : fields)
        if (std::string m = differ_on(all, f); !m.empty()) return m;
    return "";
}

std::string dtype_field(DType t) {
    return dtype_size(t) > 0 ? dtype_name(t) : fmt::format("DType value {}", static_cast<int>(t));
}

std::string placement_field(World& world, const void* p) {
    if (p == nullptr) return "null";
    if (!world.is_symmetric(p)) return "local";
    return fmt::format("symmetric +{}", static_cast<const char*>(p) - world.heap().local_base());
}

bool AgreedCall::enabled() { return agreed_depth == 0 && settings().check_agreement; }

void AgreedCall::enter() {
    active_ = true;
    ++agreed_depth;
}

AgreedCall::~AgreedCall() {
    if (active_) --agreed_depth;
}

void AgreedCall::run(World& world, const CallSignature& sig, const std::function<void()>& checks) {
    CallVerdict mine{sig, ""};
    std::exception_ptr own;
    try {
        checks();
    } catch (const std::exception& e) {
        own = std::current_exception();
        mine.error = e.what();
    }
    if (world.world_size() == 1) {
        if (own) std::rethrow_exception(own);
        return;
    }
    std::vector<CallVerdict> all;
    for (const Bytes& b : world.store().all_gather("loom/call-agreement", encode(mine))) all.push_back(decode(b));
    if (own) std::rethrow_exception(own);  // this rank's own error, as it would raise without the check
    const std::string m = disagreement(all);
    LOOM_CHECK(m.empty(), "{}", m);
}

}  // namespace loom::detail
