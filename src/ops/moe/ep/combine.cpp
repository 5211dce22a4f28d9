// loom::ep_combine: validate against the latest dispatch's handle, launch kernels/moe/ep_combine.cuh (send: each
// received pair's weighted partial sum; reduce: each token's partials pulled from the ranks it went to).
#include <algorithm>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/ep_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/ep/ep.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {

namespace kmoe = kernels::moe;

namespace {
constexpr const char* kOp = "ep_combine";
constexpr const char* kHeader = "loom/kernels/moe/ep_combine.cuh";
}  // namespace

void ep_combine(World& world, const EpHandle& handle, const MatrixView& expert_out, const MatrixView& y,
                cudaStream_t stream, const EpOptions& opts) {
    const detail::NvtxRange nvtx("loom::ep_combine T={} H={}", handle.tokens, handle.hidden);
    moe::ep::State* found = world.find_state<moe::ep::State>();
    auto checks = [&] {
        LOOM_CHECK(found != nullptr && handle.call != 0,
                   "{}: handle: expected one returned by ep_dispatch on this World, given one that is not", kOp);
        LOOM_CHECK(handle.call == found->calls,
                   "{}: handle: expected the World's latest dispatch (number {}), given dispatch number {} (a handle "
                   "is valid until the next ep_dispatch)",
                   kOp, found->calls, handle.call);
        LOOM_CHECK(!found->combined, "{}: handle: dispatch number {} was combined already (one combine per dispatch)",
                   kOp, handle.call);
        moe::ep::check_rows(kOp, "expert_out", expert_out);
        moe::ep::check_rows(kOp, "y", y);
        LOOM_CHECK(expert_out.cols == handle.hidden,
                   "{}: expert_out: expected H = {} columns (the dispatch's), given {}", kOp, handle.hidden,
                   expert_out.cols);
        LOOM_CHECK(expert_out.rows >= handle.capacity,
                   "{}: expert_out: expected >= {} rows (the handle's capacity, rows aligned with recv_x), given {}",
                   kOp, handle.capacity, expert_out.rows);
        LOOM_CHECK(y.rows == handle.tokens && y.cols == handle.hidden,
                   "{}: y: expected [{}, {}] (the dispatch's tokens and H), given [{}, {}]", kOp, handle.tokens,
                   handle.hidden, y.rows, y.cols);
        LOOM_CHECK(opts.num_blocks >= 0, "{}: opts.num_blocks: expected >= 0, given {}", kOp, opts.num_blocks);
        if (expert_out.rows > 0) detail::check_memory(&world, world.device(), kOp, "expert_out", expert_out);
        if (y.rows > 0) detail::check_memory(&world, world.device(), kOp, "y", y);
    };
    // Checking mode: every rank's checks pass before any rank's combine sends (each rank's tokens are its own).
    const detail::AgreedCall agreed(
        world,
        [&] {
            detail::CallSignature s(kOp);
            s.add("hidden", handle.hidden).add("capacity", handle.capacity).add("expert_out.cols", expert_out.cols);
            return s;
        },
        checks);
    if (!agreed.checked()) checks();
    moe::ep::State& st = *found;

    const jit::Kernel& send = moe::ep::kernel(world, kHeader, "loom::kernels::moe::ep_combine_send");
    const jit::Kernel& reduce = moe::ep::kernel(world, kHeader, "loom::kernels::moe::ep_combine_reduce");
    kmoe::EpParams p = st.params;
    p.expert_out = expert_out.data;
    p.out_ld_words = expert_out.stride() / 8;
    p.y = y.data;
    p.y_ld_words = y.stride() / 8;
    const Ctx ctx = world.ctx();
    const int sms = st.device_sms;
    send(moe::ep::launch_config(static_cast<unsigned>(moe::ep::data_blocks(std::min<int64_t>(handle.capacity, 1 << 20),
                                                                           sms, opts.num_blocks)),
                                kmoe::kEpThreads, 0, stream),
         ctx, p);
    reduce(moe::ep::launch_config(static_cast<unsigned>(moe::ep::data_blocks(handle.tokens, sms, opts.num_blocks)),
                                  kmoe::kEpThreads, 0, stream),
           ctx, p);
    st.combined = true;
}

}  // namespace loom
