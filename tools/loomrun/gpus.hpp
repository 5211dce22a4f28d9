// GPU discovery for loomrun without touching CUDA (an early cuInit in the launcher can interfere with MPS).
#pragma once

#include <string>
#include <vector>

namespace loomrun {

// Physical GPUs from /proc/driver/nvidia/gpus, else `nvidia-smi -L`; 0 when neither is there.
int physical_gpu_count();

// Devices a rank will see: CUDA_VISIBLE_DEVICES applied to the physical count with CUDA's rules (entries up
// to the first invalid one; UUIDs counted as given).
int visible_gpu_count(int physical, const char* cuda_visible_devices);

// The device indices ranks are spread over: `--gpus` ("0,2") checked against the visible count, else
// 0..visible-1. Raises std::runtime_error naming the bad entry.
std::vector<int> gpu_list(const std::string& option, int visible);

}  // namespace loomrun
