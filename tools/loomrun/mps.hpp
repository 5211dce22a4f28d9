// The CUDA MPS control daemon for ranks that share a GPU.
//
// loomrun owns the daemon only when it started it: then it lives in private pipe/log directories (so it never
// touches a user's or another job's daemon) and stop() sends `quit` and removes the directories. stop() runs
// on every exit path of loomrun (the destructor too).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loomrun {

// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for each of `ranks_per_gpu` ranks sharing a GPU (unless the user set it): 100 / n
// for one or two ranks, 12 for eight, 80 / n otherwise (mps.cpp says why).
int mps_thread_percentage(int ranks_per_gpu);

class Mps {
  public:
    // Decides and, when needed, starts MPS. `ranks_per_gpu` > 1 means ranks share a GPU. Prints one line to
    // stderr saying MPS was started, reused or not needed (or a warning when it cannot be used).
    Mps(int ranks_per_gpu, bool disabled, bool no_gpus);
    ~Mps();
    Mps(const Mps&) = delete;
    Mps& operator=(const Mps&) = delete;

    // Variables every rank gets (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE).
    const std::vector<std::pair<std::string, std::string>>& rank_env() const { return env_; }

    void stop();  // idempotent; only acts on a daemon this object started

  private:
    std::vector<std::pair<std::string, std::string>> env_;
    std::string pipe_dir_, log_dir_, control_;
    bool started_ = false;
};

}  // namespace loomrun
