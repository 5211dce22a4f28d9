#include "mps.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "procs.hpp"

namespace loomrun {
namespace {

std::string find_in_path(const std::string& exe) {
    const char* path = std::getenv("PATH");
    std::string p = path ? path : "/usr/bin:/bin";
    std::size_t pos = 0;
    while (pos <= p.size()) {
        std::size_t next = p.find(':', pos);
        std::string dir = p.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
        std::string full = (dir.empty() ? "." : dir) + "/" + exe;
        if (::access(full.c_str(), X_OK) == 0) return full;
        if (next == std::string::npos) break;
        pos = next + 1;
    }
    return "";
}

// Any process whose name (comm, 15 characters) starts with the MPS daemon's.
bool mps_process_running() {
    DIR* d = ::opendir("/proc");
    if (!d) return false;
    bool found = false;
    while (dirent* e = ::readdir(d)) {
        if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
        std::ifstream f(std::string("/proc/") + e->d_name + "/comm");
        std::string comm;
        if (std::getline(f, comm) && comm.rfind("nvidia-cuda-mps", 0) == 0) {
            found = true;
            break;
        }
    }
    ::closedir(d);
    return found;
}

// Runs the control program with the private directories, `input` on stdin and its output in `out_file`.
// Returns its exit status, or -1 when it did not finish within 10 s (it is then killed).
int run_control(const std::string& control, const std::vector<std::string>& args, const std::string& pipe_dir,
                const std::string& log_dir, const std::string& input, const std::string& out_file) {
    int in[2];
    if (::pipe(in) != 0) return -1;
    pid_t pid = ::fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        ::signal(SIGPIPE, SIG_DFL);  // loomrun ignores it; the daemon started from here keeps the default
        ::setenv("CUDA_MPS_PIPE_DIRECTORY", pipe_dir.c_str(), 1);
        ::setenv("CUDA_MPS_LOG_DIRECTORY", log_dir.c_str(), 1);
        ::dup2(in[0], 0);
        ::close(in[0]);
        ::close(in[1]);
        int out = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (out < 0) out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
        ::dup2(out, 1);
        ::dup2(out, 2);
        std::vector<char*> argv{const_cast<char*>(control.c_str())};
        for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(control.c_str(), argv.data());
        std::fprintf(stderr, "cannot execute %s: %s\n", control.c_str(), std::strerror(errno));
        ::_exit(127);
    }
    ::close(in[0]);
    if (!input.empty()) {
        [[maybe_unused]] auto w = ::write(in[1], input.data(), input.size());
    }
    ::close(in[1]);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            return -1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string temp_root() {
    const char* tmp = std::getenv("TMPDIR");
    return tmp && *tmp ? tmp : "/tmp";
}

constexpr const char* kPipePrefix = "loomrun-mps-pipe-";
constexpr const char* kLogPrefix = "loomrun-mps-log-";
constexpr const char* kOwnerFile = "loomrun.owner";

std::string make_temp_dir(const char* prefix) {
    std::string templ = temp_root() + "/" + prefix + "XXXXXX";
    if (!::mkdtemp(templ.data())) return "";
    return templ;
}

// Whether an MPS process (control daemon or server) runs with CUDA_MPS_PIPE_DIRECTORY = `pipe_dir`. Only this
// user's processes can be read, which are the only ones loomrun starts.
bool mps_process_serving(const std::string& pipe_dir) {
    DIR* d = ::opendir("/proc");
    if (!d) return false;
    const std::string want = "CUDA_MPS_PIPE_DIRECTORY=" + pipe_dir;
    bool found = false;
    while (dirent* e = ::readdir(d)) {
        if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
        const std::string proc = std::string("/proc/") + e->d_name;
        std::ifstream comm_file(proc + "/comm");
        std::string comm;
        if (!std::getline(comm_file, comm) || comm.rfind("nvidia-cuda-mps", 0) != 0) continue;
        std::ifstream env(proc + "/environ", std::ios::binary);
        for (std::string var; std::getline(env, var, '\0');)
            if (var == want) found = true;
        if (found) break;
    }
    ::closedir(d);
    return found;
}

// Stops the daemon of one stale pipe directory (its owner is gone) and removes its directories.
void reap_one(const std::string& control, const std::string& pipe_dir, const ProcId& owner,
              const std::string& log_dir) {
    std::error_code ec;
    int rc = -2;  // not asked
    if (!control.empty() && std::filesystem::exists(pipe_dir + "/control", ec))
        rc = run_control(control, {}, pipe_dir, log_dir, "quit\n", log_dir + "/loomrun-control.out");
    if (rc != 0 && mps_process_serving(pipe_dir)) {
        std::fprintf(stderr,
                     "loomrun: warning: the MPS daemon of loomrun pid %d (which is gone) still runs and could not be "
                     "stopped (%s); stop it with `echo quit | CUDA_MPS_PIPE_DIRECTORY=%s nvidia-cuda-mps-control`\n",
                     static_cast<int>(owner.pid),
                     control.empty() ? "nvidia-cuda-mps-control is not on PATH"
                     : rc < 0        ? "quit timed out"
                                     : fmt::format("quit: exit status {}", rc).c_str(),
                     pipe_dir.c_str());
        return;
    }
    std::filesystem::remove_all(pipe_dir, ec);
    if (!log_dir.empty()) std::filesystem::remove_all(log_dir, ec);
    std::fprintf(stderr, "loomrun: %s of loomrun pid %d, which is gone (pipe directory %s)\n",
                 rc == 0 ? "stopped the MPS daemon" : "removed the MPS directories", static_cast<int>(owner.pid),
                 pipe_dir.c_str());
}

}  // namespace

void reap_stale_mps_daemons(pid_t dead) {
    const std::string root = temp_root();
    DIR* d = ::opendir(root.c_str());
    if (!d) return;
    std::vector<std::string> pipes;
    while (dirent* e = ::readdir(d))
        if (std::strncmp(e->d_name, kPipePrefix, std::strlen(kPipePrefix)) == 0) pipes.push_back(e->d_name);
    ::closedir(d);
    const std::string control = find_in_path("nvidia-cuda-mps-control");
    for (const std::string& name : pipes) {
        const std::string pipe_dir = root + "/" + name;
        struct stat st {};
        if (::lstat(pipe_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) continue;
        std::ifstream f(pipe_dir + "/" + kOwnerFile);
        std::string who, log_dir;
        if (!std::getline(f, who)) continue;  // being set up by a loomrun starting now
        std::getline(f, log_dir);
        if (log_dir.rfind(root + "/" + kLogPrefix, 0) != 0 || log_dir.find("..") != std::string::npos) log_dir.clear();
        auto owner = proc_id_from_text(who);
        if (!owner || (owner->pid != dead && still_running(*owner))) continue;
        reap_one(control, pipe_dir, *owner, log_dir);
    }
}

int mps_thread_percentage(int ranks_per_gpu) {
    if (ranks_per_gpu <= 2) return 100 / std::max(1, ranks_per_gpu);
    // MPS gives a client that percentage of the SMs rounded down to whole TPCs, on SMs it picks: with (nearly) every
    // SM handed out, clients can land on the same SMs. Measured on one H200 (132 SMs), the same 4-rank GEMM timed
    // ~1.9x apart from point to point at 25 % and 24 % (32 / 30 SMs per rank) and steadily at 20 % (26 SMs); 8 ranks
    // at 12 % (14 SMs, 112 in all) run steadily. So beyond two ranks ~80-85 % of the SMs are handed out.
    if (ranks_per_gpu == 8) return 12;
    return std::max(1, 80 / ranks_per_gpu);
}

Mps::Mps(int ranks_per_gpu, bool disabled, bool no_gpus) {
    if (no_gpus) {
        std::fprintf(stderr, "loomrun: MPS not needed (no GPU visible)\n");
        return;
    }
    reap_stale_mps_daemons();
    if (ranks_per_gpu <= 1) {
        std::fprintf(stderr, "loomrun: MPS not needed (one rank per GPU)\n");
        return;
    }
    if (disabled) {
        std::fprintf(stderr, "loomrun: MPS not used (--no-mps); %d ranks per GPU will time-slice\n", ranks_per_gpu);
        return;
    }
    const std::string percentage = std::to_string(mps_thread_percentage(ranks_per_gpu));
    const char* user_pct = std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    const char* pipe_env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
    const std::string pipe = pipe_env && *pipe_env ? pipe_env : "/tmp/nvidia-mps";
    if (::access((pipe + "/control").c_str(), F_OK) == 0 && mps_process_running()) {
        if (!user_pct) env_.emplace_back("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", percentage);
        std::fprintf(stderr,
                     "loomrun: MPS reused (daemon already running, pipe directory %s); %d ranks per GPU, %s%% "
                     "active threads each\n",
                     pipe.c_str(), ranks_per_gpu, user_pct ? user_pct : percentage.c_str());
        return;
    }
    control_ = find_in_path("nvidia-cuda-mps-control");
    if (control_.empty()) {
        std::fprintf(stderr,
                     "loomrun: warning: %d ranks share each GPU but nvidia-cuda-mps-control is not on PATH; "
                     "continuing without MPS (their kernels will time-slice)\n",
                     ranks_per_gpu);
        return;
    }
    pipe_dir_ = make_temp_dir(kPipePrefix);
    log_dir_ = make_temp_dir(kLogPrefix);
    const auto me = live_process(::getpid());
    if (pipe_dir_.empty() || log_dir_.empty() || !me ||
        !(std::ofstream(pipe_dir_ + "/" + kOwnerFile) << to_text(*me) << "\n"
                                                      << log_dir_ << "\n")) {
        std::fprintf(stderr, "loomrun: warning: cannot create MPS directories (%s); continuing without MPS\n",
                     std::strerror(errno));
        stop();
        return;
    }
    int rc = run_control(control_, {"-d"}, pipe_dir_, log_dir_, "", log_dir_ + "/loomrun-control.out");
    if (rc != 0) {
        std::fprintf(stderr,
                     "loomrun: warning: `nvidia-cuda-mps-control -d` failed (%s); continuing without MPS "
                     "(see %s)\n",
                     rc < 0 ? "timed out" : fmt::format("exit status {}", rc).c_str(), log_dir_.c_str());
        log_dir_.clear();  // kept for the user to read
        std::filesystem::remove_all(pipe_dir_);
        pipe_dir_.clear();
        return;
    }
    started_ = true;
    env_.emplace_back("CUDA_MPS_PIPE_DIRECTORY", pipe_dir_);
    env_.emplace_back("CUDA_MPS_LOG_DIRECTORY", log_dir_);
    if (!user_pct) env_.emplace_back("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", percentage);
    std::fprintf(stderr, "loomrun: MPS started (pipe directory %s); %d ranks per GPU, %s%% active threads each\n",
                 pipe_dir_.c_str(), ranks_per_gpu, user_pct ? user_pct : percentage.c_str());
}

Mps::~Mps() { stop(); }

void Mps::stop() {
    if (started_) {
        started_ = false;
        int rc = run_control(control_, {}, pipe_dir_, log_dir_, "quit\n", log_dir_ + "/loomrun-control.out");
        if (rc != 0)
            std::fprintf(stderr,
                         "loomrun: warning: stopping the MPS daemon (`echo quit | nvidia-cuda-mps-control`, "
                         "pipe directory %s) failed (%s)\n",
                         pipe_dir_.c_str(), rc < 0 ? "timed out" : fmt::format("exit status {}", rc).c_str());
        if (rc != 0) {  // the daemon may still run: leave its directories so it can be reached and stopped
            pipe_dir_.clear();
            log_dir_.clear();
        }
    }
    std::error_code ec;
    if (!pipe_dir_.empty()) std::filesystem::remove_all(pipe_dir_, ec);
    if (!log_dir_.empty()) std::filesystem::remove_all(log_dir_, ec);
    pipe_dir_.clear();
    log_dir_.clear();
}

}  // namespace loomrun
