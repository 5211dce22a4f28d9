// bench-ep-ll: loom::ep_ll_dispatch (fp8) and ep_ll_combine (bf16) — expert-parallel low-latency mode — against, in
// the same timed passes, the same algorithm written with NVSHMEM's device API (bench/kernels/ep_ll_nvshmem.cuh) and
// the floor: one kernel launch after an event plus the bytes this rank moves at the peer-write bandwidth measured
// here (bench/kernels/peer_copy.cuh: every rank copies into the next rank's heap at once, as the dispatch does).
//
//   build/bin/loomrun -n 8 build/bench/bench-ep-ll [--tokens 128] [--hidden 7168] [--topk 8] [--experts 256]
//                                                  [--iters 50] [--no-nvshmem] [--out DIR]
//
// Routing: each token's k distinct experts uniformly at random (seeded per rank). Rows to DIR/ep_ll.json (rank 0;
// DIR/ep_ll_crossnode.json, op "ep_ll_crossnode", in a World of several nodes, e.g. LOOM_NODE_SIZE=4 with -n 8):
// op "ep_dispatch" / "ep_combine", "mode": "ll", T, H, k, E, "bytes_per_rank" (the largest over the ranks: dispatch
// messages of H + H / 128 x 4 + 16 bytes, combine rows of 2H bytes, to peers and self), loom_us, baselines
// {"nvshmem", "floor"}; also "peer_write_gbps" and "launch_us". Two dispatch rows (one node): the receive layout in
// cudaMalloc memory (copied in from the op's buffers) and in the symmetric heap (written by the senders,
// options.recv_in_heap; its NVSHMEM baseline is the copying version). Two combine rows: expert_out in the symmetric
// heap (the token ranks read the rows: "combine_reads": "pull"; its NVSHMEM version reads through nvshmem_ptr, one
// node only) and in cudaMalloc memory (the rows are pushed).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "loom/bf16.hpp"
#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/ep_ll_params.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/moe_ep_ll.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"
#include "loom/runtime/world.hpp"

namespace {

using json = nlohmann::json;
namespace km = loom::kernels::moe;

// bench/kernels/ep_ll_nvshmem.cuh's NvParams (the same layout).
struct NvParams {
    int32_t tokens, hidden, topk, num_experts, local_experts, max_tokens, me, world;
    const int32_t* topk_idx;
    const float* topk_weights;
    const void* x;
    void* y;
    const void* expert_out;
    void* recv_x;
    float* recv_scales;
    int32_t* recv_src_info;
    int32_t* recv_counts;
    char* staging;
    char* area;
    int64_t half_bytes;
    uint64_t* sig;
    int32_t sig_count;
    uint32_t* counters;
    uint64_t epoch;
    uint64_t timeout_ns;
    const void* expert_out_sym;
    uint64_t* done;
    unsigned long long* arrivals;
};

struct DevBuf {
    void* p = nullptr;
    explicit DevBuf(std::size_t n) {
        LOOM_CHECK_CUDA(cudaMalloc(&p, n ? n : 16));
        LOOM_CHECK_CUDA(cudaMemset(p, 0, n ? n : 16));
    }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    template <class T>
    T* as() const {
        return static_cast<T*>(p);
    }
};

std::string kernels_dir() {
    return std::filesystem::path(loom::bench::source_file("bench/kernels/peer_copy.cuh")).parent_path().string();
}

// The largest value over the ranks (the store).
double max_over_ranks(loom::World& w, double v, const std::string& tag) {
    const std::string s = fmt::format("{:.17g}", v);
    double m = v;
    for (const auto& b : w.store().all_gather(tag, loom::Bytes(s.begin(), s.end())))
        m = std::max(m, std::stod(std::string(b.begin(), b.end())));
    return m;
}

}  // namespace

int main(int argc, char** argv) {
    int tokens = 128, hidden = 7168, topk = 8, experts = 256, iters = 50;
    bool no_nvshmem = false;
    std::string out;
    CLI::App app{
        "bench-ep-ll: expert-parallel low-latency dispatch (fp8) / combine (bf16) against NVSHMEM and the floor"};
    app.add_option("--tokens", tokens, "tokens per rank (= max_tokens)")->capture_default_str();
    app.add_option("--hidden", hidden, "H (a multiple of 128)")->capture_default_str();
    app.add_option("--topk", topk, "k")->capture_default_str();
    app.add_option("--experts", experts, "E (a multiple of the world size)")->capture_default_str();
    app.add_option("--iters", iters, "timed runs")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_flag("--no-nvshmem", no_nvshmem, "skip the NVSHMEM baseline");
    app.add_option("--out", out, "folder for ep_ll.json (rank 0); default: print only");
    loom::bench::parse_or_exit(app, argc, argv);

    // The heap holds the op's areas, expert_out for the pulled combine, a receive layout for the direct dispatch and
    // the 256 MiB bandwidth probe; unless
    // LOOM_SYMMETRIC_SIZE says otherwise it is sized for them (LOOM_WORLD_SIZE: set by loomrun).
    loom::WorldOptions wopts;
    if (std::getenv("LOOM_SYMMETRIC_SIZE") == nullptr) {
        const char* ws = std::getenv("LOOM_WORLD_SIZE");
        const int64_t Wn = std::max(1, ws != nullptr ? std::atoi(ws) : 1), Ln = experts / Wn;
        const int64_t msg_b = km::ep_ll_msg_bytes(hidden, true);
        wopts.symmetric_size =
            static_cast<std::size_t>(2 * km::ep_ll_dispatch_half_bytes(Ln, Wn, tokens, msg_b) +
                                     2 * km::ep_ll_combine_half_bytes(tokens, topk, hidden, experts, Wn) +
                                     Ln * Wn * tokens * (hidden * 3 + hidden / 128 * 4 + 4)) +
            (std::size_t(512) << 20);
    }
    loom::World w = loom::World::from_env(wopts);
    const int me = w.rank(), W = w.world_size();
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const loom::EpLowLatencyShape shape{tokens, hidden, topk, experts};
    const int L = experts / W;
    LOOM_CHECK(experts % W == 0 && topk <= experts, "bench-ep-ll: expected E a multiple of W and k <= E");

    // Inputs: x ~ N(0, 1), k distinct experts per token, weights in (0, 1).
    std::mt19937_64 rng(1234 + me);
    std::normal_distribution<float> nd;
    std::vector<uint16_t> hx(std::size_t(tokens) * hidden);
    for (auto& v : hx) v = loom::float_to_bf16(nd(rng));
    std::vector<int32_t> hidx(std::size_t(tokens) * topk);
    std::vector<float> hw(hidx.size());
    for (int t = 0; t < tokens; ++t)
        for (int s = 0; s < topk; ++s) {
            int32_t e;
            do e = static_cast<int32_t>(rng() % experts);
            while (std::find(&hidx[std::size_t(t) * topk], &hidx[std::size_t(t) * topk + s], e) !=
                   &hidx[std::size_t(t) * topk + s]);
            hidx[std::size_t(t) * topk + s] = e;
            hw[std::size_t(t) * topk + s] = 0.5f + 0.5f * static_cast<float>(rng() % 1000) / 1000.f;
        }
    DevBuf x(hx.size() * 2), idx(hidx.size() * 4), wts(hw.size() * 4), y(hx.size() * 2);
    LOOM_CHECK_CUDA(cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    LOOM_CHECK_CUDA(cudaMemcpy(idx.p, hidx.data(), hidx.size() * 4, cudaMemcpyHostToDevice));
    LOOM_CHECK_CUDA(cudaMemcpy(wts.p, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    DevBuf rx(loom::ep_ll_recv_x_bytes(shape, W, true)), rs(loom::ep_ll_recv_scales_bytes(shape, W)),
        ri(loom::ep_ll_recv_src_info_bytes(shape, W)), rc(loom::ep_ll_recv_counts_bytes(shape, W)),
        eo(loom::ep_ll_recv_x_bytes(shape, W, false));
    const loom::EpLowLatencyRecv recv{rx.p, rs.as<float>(), ri.as<int32_t>(), rc.as<int32_t>()};
    const loom::MatrixView xv{x.p, loom::DType::BF16, tokens, hidden, 0};
    const loom::MatrixView yv{y.p, loom::DType::BF16, tokens, hidden, 0};
    const loom::MatrixView eov{eo.p, loom::DType::BF16, int64_t(L) * W * tokens, hidden, 0};
    // The same expert outputs in the symmetric heap: the combine's token ranks read them there (pull).
    void* eo_sym = w.alloc_bytes(loom::ep_ll_recv_x_bytes(shape, W, false));
    LOOM_CHECK_CUDA(cudaMemset(eo_sym, 0, loom::ep_ll_recv_x_bytes(shape, W, false)));
    // The uploads and fills above ran on the legacy stream, which `stream` (non-blocking) does not wait for.
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    const loom::MatrixView eov_sym{eo_sym, loom::DType::BF16, int64_t(L) * W * tokens, hidden, 0};

    // The receive layout in the symmetric heap too (one node): the senders write into it (options.recv_in_heap).
    const bool direct = w.num_nodes() == 1;
    void* rx_sym = direct ? w.alloc_bytes(loom::ep_ll_recv_x_bytes(shape, W, true)) : nullptr;
    void* rs_sym = direct ? w.alloc_bytes(loom::ep_ll_recv_scales_bytes(shape, W)) : nullptr;
    void* ri_sym = direct ? w.alloc_bytes(loom::ep_ll_recv_src_info_bytes(shape, W)) : nullptr;
    DevBuf rc_direct(loom::ep_ll_recv_counts_bytes(shape, W));
    const loom::EpLowLatencyRecv recv_sym{rx_sym, static_cast<float*>(rs_sym), static_cast<int32_t*>(ri_sym),
                                          rc_direct.as<int32_t>()};
    auto loom_dispatch = [&](cudaStream_t s) { loom::ep_ll_dispatch(w, xv, idx.as<int32_t>(), shape, recv, s); };
    auto loom_dispatch_direct = [&](cudaStream_t s) {
        loom::EpLowLatencyOptions o;
        o.recv_in_heap = true;
        loom::ep_ll_dispatch(w, xv, idx.as<int32_t>(), shape, recv_sym, s, o);
    };
    auto loom_combine = [&](cudaStream_t s) {
        loom::ep_ll_combine(w, eov, idx.as<int32_t>(), wts.as<float>(), shape, recv, yv, s);
    };
    auto loom_combine_pull = [&](cudaStream_t s) {
        loom::ep_ll_combine(w, eov_sym, idx.as<int32_t>(), wts.as<float>(), shape, recv, yv, s);
    };
    loom_dispatch(stream);  // lays out the state; the receive layout the combines read
    if (direct) loom_dispatch_direct(stream);
    loom_combine(stream);
    loom_combine_pull(stream);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));

    // Bytes this rank moves: its messages (entries x message) and the rows it returns (entries received x 2H).
    const int64_t msg = km::ep_ll_msg_bytes(hidden, true);
    const auto counts = [&] {
        std::vector<int32_t> c(std::size_t(L) * W);
        LOOM_CHECK_CUDA(cudaMemcpy(c.data(), rc.p, c.size() * 4, cudaMemcpyDeviceToHost));
        return c;
    }();
    int64_t entries_sent = 0, entries_recv = 0;
    for (int32_t e : hidx) entries_sent += e >= 0;
    for (int32_t c : counts) entries_recv += c;
    const double dispatch_bytes = max_over_ranks(w, double(entries_sent * msg), "ep-ll/bytes-d");
    const double combine_bytes = max_over_ranks(w, double(entries_recv * 2 * int64_t(hidden)), "ep-ll/bytes-c");

    // The floor's pieces: one (empty) launch after an event, and the peer-write bandwidth of every rank copying
    // 256 MiB into the next rank's heap at once.
    const std::string dir = kernels_dir();
    const auto& copy = loom::jit::get_kernel({.header = dir + "/peer_copy.cuh", .name = "loom_bench::copy_vec16"});
    int sms = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, w.device()));
    const std::size_t bw_bytes = std::size_t(256) << 20;
    void* bw_dst = w.alloc_bytes(bw_bytes);
    DevBuf bw_src(bw_bytes);
    const int node_base = w.node() * w.local_world_size();  // the next rank of this rank's node
    uint4* peer_dst = static_cast<uint4*>(w.peer_ptr(bw_dst, node_base + (w.local_rank() + 1) % w.local_world_size()));
    loom::bench::TimeOptions topts{.warmup = 5, .iters = iters, .flush_l2 = true, .world = &w};
    // Several nodes: the host barrier alone (barrier_on_stream runs within one node).
    if (w.num_nodes() == 1) topts.align = [&w](cudaStream_t st) { loom::barrier_on_stream(w, st); };
    const double copy_us = loom::bench::time_op(
                               [&](cudaStream_t s) {
                                   copy({.grid = dim3(4 * sms), .block = dim3(512), .stream = s}, peer_dst,
                                        static_cast<const uint4*>(bw_src.p), std::uint64_t(bw_bytes / 16));
                               },
                               stream, topts)
                               .median_us;
    const double peer_gbps = loom::bench::gbps(double(bw_bytes), copy_us);
    auto empty_launch = [&](cudaStream_t s) {
        copy({.grid = dim3(1), .block = dim3(32), .stream = s}, peer_dst, static_cast<const uint4*>(bw_src.p),
             std::uint64_t(0));
    };

    // NVSHMEM's version: its own heap (area, staging, signals), its counters, host call numbers.
    std::string nvshmem_note;
    const loom::jit::Kernel *nv_dispatch = nullptr, *nv_combine = nullptr, *nv_combine_pull = nullptr;
    NvParams nd_p{}, nc_p{}, ncp_p{};
    void *nv_darea = nullptr, *nv_carea = nullptr, *nv_stage = nullptr, *nv_dsig = nullptr, *nv_csig = nullptr,
         *nv_eo = nullptr, *nv_done = nullptr;
    DevBuf nv_counters(2 * km::kEpLlMaxExperts * 4), nv_arrivals(8);
    uint64_t nv_depoch = 0, nv_cepoch = 0;
    bool own_nvshmem = false;
    if (!no_nvshmem) {
        try {
            const int64_t dhalf = km::ep_ll_dispatch_half_bytes(L, W, tokens, msg);
            const int64_t chalf = km::ep_ll_combine_half_bytes(tokens, topk, hidden, experts, W);
            if (!std::getenv("NVSHMEM_SYMMETRIC_SIZE"))
                ::setenv("NVSHMEM_SYMMETRIC_SIZE",
                         std::to_string(2 * dhalf + 2 * chalf + tokens * msg +
                                        loom::ep_ll_recv_x_bytes(shape, W, false) + (std::size_t(64) << 20))
                             .c_str(),
                         1);
            own_nvshmem = !loom::nvshmem::initialized();  // a World of several nodes initialised it
            if (own_nvshmem) loom::nvshmem::init(w);
            nv_darea = loom::nvshmem::malloc(2 * dhalf);
            nv_carea = loom::nvshmem::malloc(2 * chalf);
            nv_stage = loom::nvshmem::malloc(tokens * msg);
            nv_dsig = loom::nvshmem::malloc(2 * std::size_t(L) * W * 8);
            nv_csig = loom::nvshmem::malloc(2 * std::size_t(experts) * 8);
            nv_eo = loom::nvshmem::malloc(loom::ep_ll_recv_x_bytes(shape, W, false));
            nv_done = loom::nvshmem::malloc(2 * std::size_t(W) * 8);
            LOOM_CHECK_CUDA(cudaMemset(nv_eo, 0, loom::ep_ll_recv_x_bytes(shape, W, false)));
            LOOM_CHECK_CUDA(cudaMemset(nv_done, 0, 2 * std::size_t(W) * 8));
            LOOM_CHECK_CUDA(cudaMemset(nv_dsig, 0, 2 * std::size_t(L) * W * 8));
            LOOM_CHECK_CUDA(cudaMemset(nv_csig, 0, 2 * std::size_t(experts) * 8));
            LOOM_CHECK_CUDA(cudaDeviceSynchronize());
            loom::nvshmem::barrier_all();
            nv_dispatch = &loom::jit::get_kernel(
                {.header = dir + "/ep_ll_nvshmem.cuh", .name = "ep_ll_bench::nvshmem_dispatch", .needs_nvshmem = true});
            nv_combine = &loom::jit::get_kernel(
                {.header = dir + "/ep_ll_nvshmem.cuh", .name = "ep_ll_bench::nvshmem_combine", .needs_nvshmem = true});
            if (w.num_nodes() == 1)  // it reads peers' rows by load (nvshmem_ptr): one node
                nv_combine_pull = &loom::jit::get_kernel({.header = dir + "/ep_ll_nvshmem.cuh",
                                                          .name = "ep_ll_bench::nvshmem_combine_pull",
                                                          .needs_nvshmem = true});
            NvParams p{};
            p.tokens = tokens;
            p.hidden = hidden;
            p.topk = topk;
            p.num_experts = experts;
            p.local_experts = L;
            p.max_tokens = tokens;
            p.me = me;
            p.world = W;
            p.topk_idx = idx.as<int32_t>();
            p.topk_weights = wts.as<float>();
            p.x = x.p;
            p.y = y.p;
            p.expert_out = eo.p;
            p.recv_x = rx.p;
            p.recv_scales = rs.as<float>();
            p.recv_src_info = ri.as<int32_t>();
            p.recv_counts = rc.as<int32_t>();
            p.staging = static_cast<char*>(nv_stage);
            p.counters = nv_counters.as<uint32_t>();
            p.timeout_ns = w.ctx().wait_timeout_ns;
            nd_p = p;
            nd_p.area = static_cast<char*>(nv_darea);
            nd_p.half_bytes = dhalf;
            nd_p.sig = static_cast<uint64_t*>(nv_dsig);
            nd_p.sig_count = L * W;
            nc_p = p;
            nc_p.area = static_cast<char*>(nv_carea);
            nc_p.half_bytes = chalf;
            nc_p.sig = static_cast<uint64_t*>(nv_csig);
            nc_p.sig_count = experts;
            ncp_p = nc_p;
            ncp_p.expert_out_sym = nv_eo;
            ncp_p.done = static_cast<uint64_t*>(nv_done);
            ncp_p.arrivals = nv_arrivals.as<unsigned long long>();
        } catch (const loom::Error& e) {
            nvshmem_note = std::string("NVSHMEM baseline unavailable: ") + e.what();
            if (me == 0) std::printf("%s\n", nvshmem_note.c_str());
            nv_dispatch = nv_combine = nv_combine_pull = nullptr;
        }
    }
    const unsigned grid = static_cast<unsigned>(std::min(sms, km::kEpLlMaxBlocks));
    auto nvshmem_dispatch = [&](cudaStream_t s) {
        nd_p.epoch = ++nv_depoch;
        (*nv_dispatch)({.grid = dim3(grid), .block = dim3(km::kEpLlThreads), .stream = s}, nd_p);
    };
    auto nvshmem_combine = [&](cudaStream_t s) {
        nc_p.epoch = ++nv_cepoch;
        (*nv_combine)({.grid = dim3(grid), .block = dim3(km::kEpLlThreads), .stream = s}, nc_p);
    };
    auto nvshmem_combine_pull = [&](cudaStream_t s) {  // shares the combine area, flags and call numbers
        ncp_p.epoch = ++nv_cepoch;
        (*nv_combine_pull)({.grid = dim3(grid), .block = dim3(km::kEpLlThreads), .stream = s}, ncp_p);
    };
    if (nv_dispatch) {
        // The NVSHMEM combine reads the receive layout its own dispatch wrote (the same as Loom's).
        nvshmem_dispatch(stream);
        nvshmem_combine(stream);
        if (nv_combine_pull) nvshmem_combine_pull(stream);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    }

    // The rows: {name, what, Loom's fn, its NVSHMEM version's fn (-1: none), bytes}.
    struct Form {
        const char* op;
        const char* what;
        const char* reads;
        int loom, nv;
        double bytes;
    };
    std::vector<std::function<void(cudaStream_t)>> fns = {empty_launch};
    auto add = [&fns](const std::function<void(cudaStream_t)>& f) {
        fns.push_back(f);
        return static_cast<int>(fns.size()) - 1;
    };
    const int nv_d = nv_dispatch ? add(nvshmem_dispatch) : -1, nv_c = nv_dispatch ? add(nvshmem_combine) : -1,
              nv_cp = nv_combine_pull ? add(nvshmem_combine_pull) : -1;
    std::vector<Form> forms = {{"dispatch", "fp8", "-", add(loom_dispatch), nv_d, dispatch_bytes}};
    if (direct) forms.push_back({"dispatch", "fp8 recv in heap", "-", add(loom_dispatch_direct), nv_d, dispatch_bytes});
    forms.push_back({"combine", "bf16 expert_out symmetric", "pull", add(loom_combine_pull), nv_cp, combine_bytes});
    forms.push_back({"combine", "bf16 expert_out cudaMalloc", "push", add(loom_combine), nv_c, combine_bytes});
    const auto ts = loom::bench::time_ops(fns, stream, topts);
    const double launch_us = ts[0].median_us;
    // A World of several nodes (LOOM_NODE_SIZE or hosts) reports as its own file.
    const std::string op_name = w.num_nodes() > 1 ? "ep_ll_crossnode" : "ep_ll";
    loom::bench::Report report(op_name, W, argc, argv);
    for (const Form& f : forms) {
        json baselines = {{"floor", launch_us + f.bytes / (peer_gbps * 1e3)}};
        if (f.nv >= 0) baselines["nvshmem"] = ts[f.nv].median_us;
        json row = {{"shape", fmt::format("{} T={} H={} top{} E={} {}", f.op, tokens, hidden, topk, experts, f.what)},
                    {"op", fmt::format("ep_{}", f.op)},
                    {"mode", "ll"},
                    {"combine_reads", f.reads},
                    {"T", tokens},
                    {"H", hidden},
                    {"k", topk},
                    {"E", experts},
                    {"nodes", w.num_nodes()},
                    {"bytes_per_rank", f.bytes},
                    {"peer_write_gbps", peer_gbps},
                    {"launch_us", launch_us},
                    {"loom_us", ts[f.loom].median_us},
                    {"baselines", baselines}};
        if (!nvshmem_note.empty()) row["nvshmem_note"] = nvshmem_note;
        if (me == 0)
            std::printf(
                "%s %s T=%d H=%d k=%d E=%d: loom %.2f us, nvshmem %s, floor %.2f us (%.2f MB at %.0f GB/s + "
                "launch %.2f us)\n",
                f.op, f.what, tokens, hidden, topk, experts, ts[f.loom].median_us,
                f.nv >= 0 ? fmt::format("{:.2f} us", ts[f.nv].median_us).c_str() : "-",
                baselines["floor"].get<double>(), f.bytes / 1e6, peer_gbps, launch_us);
        report.add_row(row);
    }
    if (me == 0) report.write(out.empty() ? "" : out + "/" + op_name + ".json", false);  // empty: printed

    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    if (nv_dispatch || loom::nvshmem::initialized()) {
        for (void* p : {nv_done, nv_eo, nv_csig, nv_dsig, nv_stage, nv_carea, nv_darea})
            if (p) loom::nvshmem::free(p);
        if (own_nvshmem) loom::nvshmem::finalize();
    }
    loom::release_ep_ll_state(w);
    w.free(eo_sym);
    for (void* p : {ri_sym, rs_sym, rx_sym})
        if (p) w.free(p);
    w.free(bw_dst);
    LOOM_CHECK_CUDA(cudaStreamDestroy(stream));
    return 0;
}
