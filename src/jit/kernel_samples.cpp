#include "jit/kernel_samples.hpp"

#include "jit/sources.hpp"

namespace loom::jit {

const std::vector<KernelSample>& kernel_samples() {
    static const std::vector<KernelSample> samples = {
        // ---- GEMM (h5) ----
        {"loom/kernels/gemm/gemm.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_bfloat16", "__nv_bfloat16", "float", "128", "256", "4", "true", "2", "true", "loom::tile::GemmNoHooks"},
         true},
        {"loom/kernels/gemm/gemm.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__half", "float", "__nv_bfloat16", "64", "128", "6", "false", "1", "false", "loom::tile::GemmNoHooks"},
         true},
        {"loom/kernels/gemm/gemm.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_bfloat16", "__nv_bfloat16", "float", "128", "224", "4", "true", "1", "true", "loom::tile::GemmNoHooks"},
         true},
        {"loom/kernels/gemm/gemm.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_fp8_e4m3", "__nv_bfloat16", "void", "128", "256", "4", "true", "1", "true", "loom::tile::GemmNoHooks"},
         true},
        {"loom/kernels/gemm/gemm_sm80.cuh",
         "loom::kernels::gemm_sm80_mma_sync",
         {"__nv_bfloat16", "__nv_bfloat16", "float", "4", "true"}},
        // ---- MoE: grouped GEMM ----
        {"loom/kernels/moe/grouped_gemm.cuh",
         "loom::kernels::moe::grouped_gemm_sm90",
         {"__nv_bfloat16", "__nv_bfloat16", "128", "256", "4", "true", "0", "loom::kernels::moe::GroupedNoHooks"},
         true},
        {"loom/kernels/moe/grouped_gemm.cuh",
         "loom::kernels::moe::grouped_gemm_sm90",
         {"__nv_fp8_e4m3", "__nv_bfloat16", "64", "256", "6", "true", "1", "loom::kernels::moe::GroupedNoHooks"},
         true},
        {"loom/kernels/moe/grouped_gemm_sm80.cuh",
         "loom::kernels::moe::grouped_gemm_sm80",
         {"__nv_bfloat16", "__nv_bfloat16", "4", "false", "1", "loom::kernels::moe::GroupedNoHooks"}},
        {"loom/kernels/moe/grouped_tiles.cuh", "", {}},  // device helpers and hooks of the two kernels above
        // ---- overlapped GEMM + collectives (h9) ----
        {"loom/kernels/overlap/ag_gemm.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_bfloat16", "__nv_bfloat16", "float", "128", "256", "4", "true", "1", "true",
          "loom::kernels::overlap::AgGemmHooks"},
         true},
        {"loom/kernels/overlap/ag_gemm.cuh", "loom::kernels::overlap::ag_gemm_push", {"0"}},
        {"loom/kernels/overlap/ag_gemm.cuh", "loom::kernels::overlap::ag_gemm_push", {"1"}, true},
        {"loom/kernels/overlap/gemm_rs.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_bfloat16", "__nv_bfloat16", "float", "128", "256", "4", "true", "1", "true",
          "loom::kernels::overlap::TileNotifyHooks"},
         true},
        {"loom/kernels/overlap/gemm_rs.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_bfloat16", "__nv_bfloat16", "void", "128", "256", "4", "true", "1", "true",
          "loom::kernels::overlap::RsAccHooks"},
         true},
        {"loom/kernels/overlap/gemm_rs_pull.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_bfloat16", "__nv_bfloat16", "void", "128", "256", "4", "true", "1", "true",
          "loom::kernels::overlap::RsPullHooks"},
         true},
        {"loom/kernels/overlap/gemm_rs_pull.cuh",
         "loom::kernels::overlap::gemm_rs_pull_finish",
         {"__nv_bfloat16", "128", "256"}},
        {"loom/kernels/overlap/gemm_rs.cuh", "loom::kernels::overlap::gemm_rs_scatter_reduce", {"__nv_bfloat16"}},
        {"loom/kernels/overlap/gemm_rs.cuh", "loom::kernels::overlap::gemm_rs_scatter_reduce", {"float"}},
        {"loom/kernels/overlap/gemm_ar.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_bfloat16", "__nv_bfloat16", "float", "64", "128", "6", "true", "1", "true",
          "loom::kernels::overlap::TileNotifyHooks"},
         true},
        {"loom/kernels/overlap/gemm_ar.cuh", "loom::kernels::overlap::gemm_ar_reduce", {"__nv_bfloat16"}},
        {"loom/kernels/overlap/gemm_ar.cuh", "loom::kernels::overlap::gemm_ar_reduce", {"__half"}},
        // ---- MoE routing ----
        {"loom/kernels/moe/routing.cuh", "loom::kernels::moe::moe_route_count", {}, false, {}},
        {"loom/kernels/moe/routing.cuh", "loom::kernels::moe::moe_route_scan", {}, false, {}},
        {"loom/kernels/moe/routing.cuh", "loom::kernels::moe::moe_route_scatter", {}, false, {}},
        {"loom/kernels/moe/routing.cuh", "loom::kernels::moe::moe_permute", {"uint4"}},
        {"loom/kernels/moe/routing.cuh", "loom::kernels::moe::moe_permute", {"unsigned short"}},
        {"loom/kernels/moe/routing.cuh", "loom::kernels::moe::moe_topk_reduce", {"__nv_bfloat16", "float"}},
        {"loom/kernels/moe/routing.cuh", "loom::kernels::moe::moe_topk_reduce", {"float", "__half"}},
        // ---- MoE: expert-parallel dispatch / combine, throughput mode ----
        {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_layout_count", {}, false, {}},
        {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_layout_scan", {}, false, {}},
        {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_layout_index", {}, false, {}},
        {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_dispatch_push", {}, false, {}},
        {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_dispatch_arrive", {}, false, {}},
        {"loom/kernels/moe/ep_combine.cuh", "loom::kernels::moe::ep_combine_send", {}, false, {}},
        {"loom/kernels/moe/ep_combine.cuh", "loom::kernels::moe::ep_combine_reduce", {}, false, {}},
        // ---- attention ----
        {"loom/kernels/attention/decode.cuh",
         "loom::kernels::attention::decode_split",
         {"__nv_bfloat16", "128", "8", "1", "4", "32", "0"}},
        {"loom/kernels/attention/decode.cuh",
         "loom::kernels::attention::decode_split",
         {"__nv_bfloat16", "128", "8", "1", "3", "64", "1"}},
        {"loom/kernels/attention/decode.cuh",
         "loom::kernels::attention::decode_split",
         {"__half", "64", "1", "1", "4", "64", "0"}},
        {"loom/kernels/attention/decode.cuh", "loom::kernels::attention::decode_merge", {"__nv_bfloat16", "256"}},
        {"loom/kernels/attention/sp_decode.cuh",
         "loom::kernels::attention::sp_decode_combine",
         {"__nv_bfloat16", "128"}},
        // ---- TP-MoE, fused ----
        {"loom/kernels/moe/tp_moe.cuh",
         "loom::kernels::moe::grouped_gemm_sm90",
         {"__nv_bfloat16", "__nv_bfloat16", "128", "256", "4", "true", "1", "loom::kernels::moe::MoeAgHooks"},
         true},
        {"loom/kernels/moe/tp_moe.cuh",
         "loom::kernels::moe::grouped_gemm_sm90",
         {"__nv_bfloat16", "float", "64", "128", "4", "true", "0", "loom::kernels::moe::MoeRsHooks"},
         true},
        {"loom/kernels/moe/tp_moe.cuh", "loom::kernels::moe::moe_ag_push", {}},
        {"loom/kernels/moe/tp_moe.cuh", "loom::kernels::moe::moe_rs_reduce_send", {"__nv_bfloat16"}},
        {"loom/kernels/attention/ulysses.cuh", "loom::kernels::attention::ulysses_qkv_a2a", {}},
        {"loom/kernels/attention/ulysses.cuh", "loom::kernels::attention::ulysses_o_a2a", {}},
        {"loom/kernels/attention/ulysses_o_gemm.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_bfloat16", "__nv_bfloat16", "float", "128", "256", "4", "true", "1", "true",
          "loom::kernels::attention::UlyssesOGemmHooks"},
         true},
        // ---- collectives ----
        {"loom/kernels/collectives/coll_common.cuh", "loom::kernels::coll::coll_barrier", {}},
        // ---- the profiler's clock reading ----
        {"loom/kernels/profile/clock_ping.cuh", "loom::kernels::profile::clock_ping", {}},
        {"loom/kernels/collectives/all_gather.cuh", "loom::kernels::coll::all_gather_push", {"float", "0"}},
        {"loom/kernels/collectives/all_gather.cuh",
         "loom::kernels::coll::all_gather_push",
         {"__nv_bfloat16", "1"},
         true},
        {"loom/kernels/collectives/all_gather.cuh", "loom::kernels::coll::all_gather_pull", {"float", "0"}},
        {"loom/kernels/collectives/all_gather.cuh", "loom::kernels::coll::all_gather_ring", {"float", "0"}},
        {"loom/kernels/collectives/all_reduce.cuh",
         "loom::kernels::coll::all_reduce_one_shot",
         {"__nv_bfloat16", "0", "0"}},
        {"loom/kernels/collectives/all_reduce.cuh",
         "loom::kernels::coll::all_reduce_one_shot",
         {"float", "1", "1"},
         true},
        {"loom/kernels/collectives/all_gather.cuh",
         "loom::kernels::coll::all_gather_pull",
         {"unsigned char", "1"},
         true},
        {"loom/kernels/collectives/all_reduce.cuh", "loom::kernels::coll::all_reduce_two_shot", {"float", "0"}},
        {"loom/kernels/collectives/coll_ll.cuh", "loom::kernels::coll::all_reduce_ll", {"float", "1"}},
        {"loom/kernels/collectives/coll_ll.cuh", "loom::kernels::coll::all_reduce_ll", {"__nv_bfloat16", "0"}},
        {"loom/kernels/collectives/coll_ll.cuh", "loom::kernels::coll::reduce_scatter_ll", {"__half", "0"}},
        {"loom/kernels/collectives/coll_ll.cuh", "loom::kernels::coll::all_gather_ll", {"unsigned char"}},
        {"loom/kernels/collectives/coll_ll.cuh", "loom::kernels::coll::all_to_all_ll", {"unsigned char"}},
        {"loom/kernels/collectives/all_to_all.cuh", "loom::kernels::coll::all_to_all_push", {"float", "0"}},
        {"loom/kernels/collectives/all_to_all.cuh", "loom::kernels::coll::all_to_all_pull", {"unsigned char", "0"}},
        {"loom/kernels/collectives/all_to_all.cuh",
         "loom::kernels::coll::all_to_all_pull",
         {"unsigned char", "1"},
         true},
        {"loom/kernels/collectives/all_to_all.cuh", "loom::kernels::coll::all_to_all_v_push", {"__nv_bfloat16", "0"}},
        {"loom/kernels/collectives/all_to_all.cuh",
         "loom::kernels::coll::all_to_all_v_pull",
         {"unsigned int", "1"},
         true},
        {"loom/kernels/collectives/reduce_scatter.cuh", "loom::kernels::coll::reduce_scatter_pull", {"float", "0"}},
        {"loom/kernels/collectives/reduce_scatter.cuh",
         "loom::kernels::coll::reduce_scatter_scatter",
         {"__half", "0", "0"}},
        {"loom/kernels/collectives/reduce_scatter.cuh",
         "loom::kernels::coll::reduce_scatter_ring",
         {"__nv_bfloat16", "0"}},
        {"loom/kernels/collectives/reduce_scatter.cuh",
         "loom::kernels::coll::reduce_scatter_ce_reduce",
         {"__nv_bfloat16", "0"}},
    };
    return samples;
}

const std::vector<std::string>& sm90_only_headers() {
    static const std::vector<std::string> h = {};
    return h;
}

std::vector<std::string> standalone_headers() {
    std::vector<std::string> out;
    for (const auto& [path, text] : detail::embedded_headers()) {
        std::string p(path);
        bool cuh = p.size() > 4 && p.ends_with(".cuh");
        bool plain = p == "loom/config.hpp" || p == "loom/tensor.hpp" ||
                     (p.starts_with("loom/kernels/") && p.ends_with("_params.hpp"));
        if (cuh || plain) out.push_back(p);
    }
    return out;
}

}  // namespace loom::jit
