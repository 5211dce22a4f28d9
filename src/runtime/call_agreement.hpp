// Cross-rank agreement of collective calls, a checking mode (Settings::check_agreement, LOOM_CHECK_AGREEMENT=1; on in
// the test suites). Every collective and overlapped op is a call every rank makes alike; a rank calling with another
// count, dtype or option hangs or writes out of bounds. In checking mode each such call first runs its own argument
// checks, then the ranks exchange their call's signature and their checks' verdict through the bootstrap store (one
// host round trip), and every rank raises the same loom::Error when a rank's checks failed or the signatures differ,
// naming the rank and the field. Off, it costs a flag test per call.
//
// Calls an agreed call makes inside itself (the Sequential algorithms' loom::all_gather, ...) are parts of it and are
// not exchanged again (a per-thread depth).
#pragma once

#include <concepts>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/runtime/store.hpp"
#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom::detail {

// One call's signature: the op and the named fields every rank must give alike, in a fixed order.
class CallSignature {
  public:
    explicit CallSignature(std::string op = "") : op_(std::move(op)) {}
    CallSignature& add(std::string field, std::string value);
    template <std::integral I>
    CallSignature& add(std::string field, I value) {
        return add(std::move(field), std::to_string(value));
    }
    const std::string& op() const { return op_; }
    const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }

  private:
    std::string op_;
    std::vector<std::pair<std::string, std::string>> fields_;
};

// What one rank contributes: its signature and its own checks' error ("" when they passed).
struct CallVerdict {
    CallSignature sig;
    std::string error;
};
Bytes encode(const CallVerdict& v);
// Raises on a malformed encoding (a peer of another Loom version).
CallVerdict decode(const Bytes& b);

// The error every rank raises for these verdicts (index = rank), "" when every rank's checks passed and the
// signatures agree. A failed check: the first failing rank's error. A disagreement: the first field (the op first) on
// which a rank differs from the value most ranks give (ties: the lowest rank's), naming the ranks on each side.
std::string disagreement(const std::vector<CallVerdict>& all);

// "<dtype name>", or "DType value <n>" for a value outside the enum.
std::string dtype_field(DType t);
// Where p lies for a signature: "symmetric +<offset>" in world's heap, "null", or "local" (not compared across ranks).
std::string placement_field(World& world, const void* p);

// A collective call, checked across ranks while it lives when checking mode is on and no other agreed call is in
// progress on this thread: the constructor runs `checks` (the call's own argument checks), exchanges the verdicts
// and raises per disagreement(). checked(): whether that happened (then the op need not run its checks again).
class AgreedCall {
  public:
    template <class Signature, class Checks>
    AgreedCall(World& world, Signature&& signature, Checks&& checks) {
        if (!enabled()) return;
        run(world, signature(), std::function<void()>(std::forward<Checks>(checks)));
        enter();
    }
    ~AgreedCall();
    AgreedCall(const AgreedCall&) = delete;
    AgreedCall& operator=(const AgreedCall&) = delete;
    bool checked() const { return active_; }

  private:
    static bool enabled();  // settings().check_agreement, outside another agreed call
    static void run(World& world, const CallSignature& sig, const std::function<void()>& checks);
    void enter();
    bool active_ = false;
};

}  // namespace loom::detail
