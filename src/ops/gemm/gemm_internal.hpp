// loom::gemm's pieces shared by src/ops/gemm/gemm.cpp (the launch) and src/ops/gemm/gemm_tune.cpp (the config choice and the
// autotuner, which times candidates through the same launch path).
#pragma once

#include <cuda_runtime_api.h>

#include "loom/ops/gemm.hpp"

namespace loom::detail {

struct GemmDevice {
    int device = 0;
    int arch = 0;     // e.g. 90
    int num_sms = 0;  // as the device reports it (an MPS client's share where MPS limits it)
};
// The current device's, cached per device.
GemmDevice gemm_device();
// Whether loom::gemm runs the sm_80 kernel: below sm_90, or forced (GemmOptions::force_sm80, LOOM_GEMM_FORCE_SM80).
bool gemm_takes_sm80(const GemmOptions& o, const GemmDevice& dev);

// gemm_config_for() for the device `dev` (loom::gemm has looked it up already).
GemmConfig gemm_config_for(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                           const GemmDevice& dev, cudaStream_t stream, std::string* source);

// Stages (kernels::gemm_sm90_plan_stages: the most that fit, <= 12), raster group (about sqrt(SMs x BLOCK_N / BLOCK_M)
// M-blocks, LOOM_GEMM_GROUP_M overrides it) and persistent grid of a tile choice, as gemm_heuristic sets them;
// tail_splits is left as it is.
void gemm_complete_config(GemmConfig& c, int64_t m, int64_t n, int num_sms);

// Set on this thread while an overlapped op's candidates are timed (src/ops/overlap/overlap_tune.cpp): loom::gemm calls
// made by those candidates (the sequential algorithms' GEMM) then take the heuristic, neither timing nor remembering
// anything — a rank whose GEMM key was already decided would otherwise skip a tuning its peers run, and wait for them
// inside the collective part for seconds.
bool& gemm_tuning_suppressed();

// Launches validated inputs with `cfg` as loom::gemm does after choosing it: the sm_80 path where forced or below
// sm_90, the direct-store epilogue for beta != 0, the split tail bound to (device, stream). Raises loom::Error on a
// config the inputs cannot take. `source` (for LOOM_GEMM_DEBUG) names where cfg came from; nullptr prints nothing.
void gemm_launch(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o, GemmConfig cfg,
                 const GemmDevice& dev, cudaStream_t stream, const char* source);

}  // namespace loom::detail
