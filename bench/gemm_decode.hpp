// bench-gemm --decode: decode-sized GEMMs (M <= 128) over a grid of M x N x K, loom::gemm as a caller gets it (its own
// config choice) against cuBLASLt in the same interleaved runs, with the weights' streaming rate as a fraction of the
// device's copy bandwidth (docs/perf/gemm_decode.json).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/tensor.hpp"

namespace loom::bench {

// DeepGEMM's calc_diff between a bf16 result on the device and a bf16 reference on the host: 1 - 2 sum(xy) /
// sum(x^2 + y^2), ~1e-7 for bf16 outputs of the same fp32 products; NaNs (unwritten outputs) counted apart.
struct GemmCheck {
    double diff = 1;
    int64_t nans = 0;
    bool ok() const { return nans == 0 && diff < 1e-5; }
};
GemmCheck compare_bf16(const void* c, const std::vector<uint16_t>& ref, std::size_t n);

struct DecodeGrid {
    std::vector<int> m = {1, 8, 16, 32, 64, 128};
    std::vector<int> n = {1024, 4096, 8192, 16384, 32768};
    std::vector<int> k = {1024, 4096, 8192, 16384};
    std::vector<DType> dtypes = {DType::BF16, DType::F8E4M3};
    int iters = 30;
    double copy_gbps = 0;  // the device's copy bandwidth; 0: measured in the run (a device-to-device cudaMemcpy)
    std::string out;       // JSON file, or empty
    int sweep = 0;  // > 0: also time the decode plan's candidates (the this many cheapest by its model, the cheapest
                    // whole-tile one and the chosen one) per shape, into each row's "candidates"
};

// Runs the grid, printing a line per shape as it is timed and a summary per input type; returns the process's exit
// status (0 unless a result failed its check).
int run_decode_grid(const DecodeGrid& grid, int argc, char** argv);

}  // namespace loom::bench
