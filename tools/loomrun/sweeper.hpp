// The clean-up that must happen even when loomrun itself is SIGKILLed.
//
// Ranks die with loomrun on their own (PR_SET_PDEATHSIG, launcher.cpp), but what a rank started does not, and a
// private MPS daemon would keep running. So loomrun forks a small helper first thing. The helper runs in its own
// process group (a signal to loomrun's group does not reach it), ignores the terminal's signals and blocks reading
// a pipe whose only writer is loomrun. loomrun sends it each rank's process group as the rank starts. When the pipe
// closes without loomrun having said "done" (loomrun died), the helper SIGKILLs those groups, stops the MPS daemon
// loomrun started (mps.hpp, reap_stale_mps_daemons) and exits; after "done" it exits at once.
#pragma once

#include <sys/types.h>

namespace loomrun {

class Sweeper {
  public:
    // Forks the helper; when that fails it prints a warning and the job runs without it.
    Sweeper();
    ~Sweeper();  // release()
    Sweeper(const Sweeper&) = delete;
    Sweeper& operator=(const Sweeper&) = delete;

    void watch_group(pid_t pgid);  // a rank's process group, to SIGKILL if loomrun dies
    void release();                // loomrun has cleaned up itself: the helper exits doing nothing (idempotent)
    pid_t pid() const { return pid_; }

  private:
    int fd_ = -1;
    pid_t pid_ = -1;
};

}  // namespace loomrun
