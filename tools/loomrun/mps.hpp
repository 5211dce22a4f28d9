// The CUDA MPS control daemon for ranks that share a GPU.
//
// loomrun owns the daemon only when it started it: then it lives in private pipe/log directories (so it never
// touches a user's or another job's daemon) and stop() sends `quit` and removes the directories. stop() runs
// on every exit path of loomrun (the destructor too). The pipe directory holds a file, loomrun.owner, naming the
// loomrun that started the daemon (pid and start time) and its log directory: when that loomrun was killed before
// it could stop its daemon, the daemon is found and stopped by loomrun's helper (sweeper.hpp) or, failing that, by
// the next loomrun that starts on a machine with a GPU (reap_stale_mps_daemons).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace loomrun {

// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for each of `ranks_per_gpu` ranks sharing a GPU (unless the user set it): 100 / n
// for one or two ranks, 12 for eight, 80 / n otherwise (mps.cpp says why).
int mps_thread_percentage(int ranks_per_gpu);

// Stops the private MPS daemons of loomruns that are gone and removes their directories: every
// $TMPDIR/loomrun-mps-pipe-* (else /tmp/...) of this user whose loomrun.owner names a process that no longer runs,
// or `dead` (a launcher known to have died, perhaps not yet reaped). Each daemon gets `quit` through
// nvidia-cuda-mps-control under its own directories; the directories are removed once it has quit or when no MPS
// process serves them. Prints one line per directory handled; a daemon that cannot be stopped is named in a warning
// and its directories are left for the next attempt.
void reap_stale_mps_daemons(pid_t dead = 0);

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
