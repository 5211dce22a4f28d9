// loomrun, run as a program: rank variables, output prefixes, failure propagation, timeouts, signals, no process
// outliving the job (a rank killed, loomrun killed, leftovers of the ranks) and the MPS daemon's life cycle (with
// stand-in nvidia-smi / nvidia-cuda-mps-control scripts on a machine without GPU), stale daemons included.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

const std::string kLoomrun = LOOM_BINARY_DIR "/bin/loomrun";

struct Run {
    int code = -1;  // exit status, or 128 + signal
    std::string out, err;
    Clock::duration elapsed{};
};

struct RunOpts {
    std::vector<std::pair<std::string, std::string>> set;
    std::vector<std::string> unset = {"CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "LOOM_RANK"};
    std::chrono::milliseconds signal_after{0};  // send SIGTERM to loomrun after this long (0: never)
};

// A loomrun started in the background whose output is read as it comes, so that a test can act mid-job.
class Live {
  public:
    Live(const std::vector<std::string>& args, const RunOpts& opts) : start_(Clock::now()), opts_(opts) {
        int o[2], e[2];
        if (::pipe(o) != 0 || ::pipe(e) != 0) throw std::runtime_error("pipe");
        pid_ = ::fork();
        if (pid_ == 0) {
            ::dup2(o[1], 1);
            ::dup2(e[1], 2);
            ::close(o[0]);
            ::close(e[0]);
            for (auto& name : opts.unset) ::unsetenv(name.c_str());
            for (auto& [k, v] : opts.set) ::setenv(k.c_str(), v.c_str(), 1);
            std::vector<char*> argv{const_cast<char*>(kLoomrun.c_str())};
            for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
            argv.push_back(nullptr);
            ::execv(kLoomrun.c_str(), argv.data());
            ::_exit(127);
        }
        ::close(o[1]);
        ::close(e[1]);
        fds_[0] = {o[0], POLLIN, 0};
        fds_[1] = {e[0], POLLIN, 0};
    }
    ~Live() {
        if (pid_ > 0 && !reaped_) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
        for (auto& f : fds_)
            if (f.fd >= 0) ::close(f.fd);
    }
    pid_t pid() const { return pid_; }
    const Run& so_far() const { return run_; }

    // Reads output until `done(run)` holds (true) or `limit` passes (false).
    bool read_until(const std::function<bool(const Run&)>& done, Clock::duration limit) {
        const auto deadline = Clock::now() + limit;
        while (!done(run_)) {
            if (Clock::now() >= deadline || !read_some()) return done(run_);
        }
        return true;
    }

    // Reads until both streams close (30 s at most, then SIGKILL), then reaps loomrun.
    Run finish() {
        while (Clock::now() - start_ < 30s && read_some()) {
        }
        return reap();
    }

    // Reaps loomrun without reading further (after it was killed).
    Run reap() {
        if (fds_[0].fd >= 0 || fds_[1].fd >= 0) ::kill(pid_, SIGKILL);
        int status = 0;
        ::waitpid(pid_, &status, 0);
        reaped_ = true;
        run_.elapsed = Clock::now() - start_;
        run_.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return run_;
    }

  private:
    // One poll of 50 ms; false once both streams are closed.
    bool read_some() {
        if (fds_[0].fd < 0 && fds_[1].fd < 0) return false;
        if (!signalled_ && opts_.signal_after.count() > 0 && Clock::now() - start_ >= opts_.signal_after) {
            ::kill(pid_, SIGTERM);
            signalled_ = true;
        }
        if (::poll(fds_, 2, 50) <= 0) return true;
        std::string* bufs[2] = {&run_.out, &run_.err};
        for (int i = 0; i < 2; ++i) {
            if (!fds_[i].revents) continue;
            char buf[4096];
            ssize_t k = ::read(fds_[i].fd, buf, sizeof(buf));
            if (k > 0) {
                bufs[i]->append(buf, k);
            } else {
                ::close(fds_[i].fd);
                fds_[i].fd = -1;
            }
        }
        return true;
    }

    Clock::time_point start_;
    RunOpts opts_;
    pid_t pid_ = -1;
    bool reaped_ = false, signalled_ = false;
    pollfd fds_[2] = {{-1, 0, 0}, {-1, 0, 0}};
    Run run_;
};

// Runs loomrun with `args`, capturing stdout and stderr; killed after 30 s.
Run run_loomrun(const std::vector<std::string>& args, const RunOpts& opts = {}) { return Live(args, opts).finish(); }

std::string fmt_rank(int r) { return "[rank " + std::to_string(r) + "] "; }

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// Whether `pid` is a live process: exists and is not a zombie (an orphan's zombie stays until its new parent
// reaps it, which a container's init may never do).
bool alive(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(f, line)) return false;
    auto close = line.rfind(')');
    char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
    return state != 'Z' && state != 'X';
}

// Polls until none of `pids` is alive or `limit` passes; returns how long it took (or `limit` if some survive).
Clock::duration until_all_dead(const std::vector<pid_t>& pids, Clock::duration limit) {
    const auto start = Clock::now();
    while (Clock::now() - start < limit) {
        bool any = false;
        for (pid_t p : pids) any |= alive(p);
        if (!any) return Clock::now() - start;
        std::this_thread::sleep_for(2ms);
    }
    return limit;
}

// The numbers after `tag` on each "[rank r] tag a b ..." line of `out`, for `n` ranks; empty until all are there.
std::vector<std::vector<pid_t>> rank_pids(const std::string& out, const std::string& tag, int n) {
    std::vector<std::vector<pid_t>> pids(n);
    for (int r = 0; r < n; ++r) {
        auto at = out.find(fmt_rank(r) + tag + " ");
        if (at == std::string::npos) return {};
        auto end = out.find('\n', at);
        if (end == std::string::npos) return {};
        const auto from = at + fmt_rank(r).size() + tag.size();
        std::istringstream line(out.substr(from, end - from));
        for (long long p; line >> p;) pids[r].push_back(static_cast<pid_t>(p));
    }
    return pids;
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

class Loomrun : public ::testing::Test {
  protected:
    void SetUp() override {
        ASSERT_EQ(::access(kLoomrun.c_str(), X_OK), 0) << kLoomrun << " is not built (target loomrun)";
    }
};

TEST_F(Loomrun, RanksGetTheirVariables) {
    auto r =
        run_loomrun({"-n", "4", "/bin/sh", "-c",
                     "echo \"rank=$LOOM_RANK world=$LOOM_WORLD_SIZE local=$LOOM_LOCAL_RANK/$LOOM_LOCAL_WORLD_SIZE "
                     "addr=$LOOM_MASTER_ADDR port=$LOOM_MASTER_PORT nvls=$NCCL_NVLS_ENABLE/$NVSHMEM_DISABLE_NVLS\""});
    ASSERT_EQ(r.code, 0) << r.err;
    std::string port;
    for (int rank = 0; rank < 4; ++rank) {
        std::string line = "[rank " + std::to_string(rank) + "] rank=" + std::to_string(rank) +
                           " world=4 local=" + std::to_string(rank) + "/4 addr=127.0.0.1 port=";
        auto at = r.out.find(line);
        ASSERT_NE(at, std::string::npos) << r.out;
        std::string rest = r.out.substr(at + line.size(), r.out.find('\n', at) - at - line.size());
        std::string p = rest.substr(0, rest.find(' '));
        EXPECT_GT(std::stoi(p), 0);
        if (rank == 0) port = p;
        EXPECT_EQ(p, port) << "every rank meets at the same port";
        EXPECT_TRUE(contains(rest, "nvls=0/1")) << rest;
    }
    EXPECT_FALSE(contains(r.out, "[rank 4]"));
    auto fixed = run_loomrun({"-n", "2", "--port", "23456", "/bin/sh", "-c", "echo port=$LOOM_MASTER_PORT"});
    EXPECT_TRUE(contains(fixed.out, "[rank 1] port=23456")) << fixed.out;
}

// Every rank of a job gets the same fresh 256-bit secret; another job gets another.
TEST_F(Loomrun, RanksShareAFreshJobSecret) {
    auto secrets = [] {
        auto r = run_loomrun({"-n", "3", "/bin/sh", "-c", "echo secret=$LOOM_JOB_SECRET"});
        EXPECT_EQ(r.code, 0) << r.err;
        std::vector<std::string> found;
        for (int rank = 0; rank < 3; ++rank) {
            const std::string tag = fmt_rank(rank) + "secret=";
            auto at = r.out.find(tag);
            EXPECT_NE(at, std::string::npos) << r.out;
            if (at != std::string::npos) found.push_back(r.out.substr(at + tag.size(), 64));
        }
        return found;
    };
    auto a = secrets(), b = secrets();
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    for (auto& s : a) {
        EXPECT_EQ(s.find_first_not_of("0123456789abcdef"), std::string::npos) << s;
        EXPECT_EQ(s, a[0]) << "ranks of one job got different secrets";
    }
    EXPECT_NE(a[0], b[0]) << "two jobs got the same secret";
}

TEST_F(Loomrun, OutputLinesCarryTheRankPrefix) {
    auto r = run_loomrun(
        {"-n", "2", "/bin/sh", "-c", "echo one; echo two; echo oops >&2; printf 'no newline'; printf 'tail' >&2"});
    ASSERT_EQ(r.code, 0) << r.err;
    for (int rank = 0; rank < 2; ++rank) {
        std::string p = "[rank " + std::to_string(rank) + "] ";
        EXPECT_TRUE(contains(r.out, p + "one\n")) << r.out;
        EXPECT_TRUE(contains(r.out, p + "two\n")) << r.out;
        EXPECT_TRUE(contains(r.out, p + "no newline\n")) << r.out;
        EXPECT_TRUE(contains(r.err, p + "oops\n")) << r.err;
        EXPECT_TRUE(contains(r.err, p + "tail\n")) << r.err;
        EXPECT_FALSE(contains(r.out, p + "oops")) << "stderr leaked into stdout";
    }
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("[rank ", 0), 0u) << line;
}

TEST_F(Loomrun, FailingRankStopsTheOthersAndSetsTheExitCode) {
    auto r = run_loomrun({"-n", "3", "/bin/sh", "-c", "if [ \"$LOOM_RANK\" = 1 ]; then exit 3; fi; sleep 60"});
    EXPECT_EQ(r.code, 3) << r.err;
    EXPECT_LT(r.elapsed, 10s) << "the sleeping ranks were not stopped";
    EXPECT_TRUE(contains(r.err, "rank 1 exited with status 3")) << r.err;
}

TEST_F(Loomrun, RankKilledBySignal) {
    auto r = run_loomrun({"-n", "2", "/bin/sh", "-c", "if [ \"$LOOM_RANK\" = 0 ]; then kill -KILL $$; fi; sleep 60"});
    EXPECT_EQ(r.code, 128 + SIGKILL) << r.err;
    EXPECT_LT(r.elapsed, 10s);
}

// Each rank: a shell (the rank) with a child in its process group; prints "pids <shell> <child>".
const std::vector<std::string> kShellWithChild = {"/bin/sh", "-c", "sleep 60 & echo \"pids $$ $!\"; wait"};

std::vector<std::vector<pid_t>> wait_for_pids(Live& job, int ranks) {
    std::vector<std::vector<pid_t>> pids;
    job.read_until(
        [&](const Run& r) {
            pids = rank_pids(r.out, "pids", ranks);
            return !pids.empty();
        },
        20s);
    return pids;
}

// kill -9 of one rank from outside: loomrun stops the others and everything they started, exits 128 + 9, and says
// which rank died of which signal.
TEST_F(Loomrun, RankKilledFromOutsideEndsTheJob) {
    constexpr int kRanks = 4;
    std::vector<std::string> args = {"-n", std::to_string(kRanks)};
    args.insert(args.end(), kShellWithChild.begin(), kShellWithChild.end());
    Live job(args, {});
    auto pids = wait_for_pids(job, kRanks);
    ASSERT_FALSE(pids.empty()) << job.so_far().out << job.so_far().err;
    const auto killed_at = Clock::now();
    ASSERT_EQ(::kill(pids[2][0], SIGKILL), 0);
    auto r = job.finish();
    const auto teardown = Clock::now() - killed_at;
    EXPECT_EQ(r.code, 128 + SIGKILL) << r.err;
    EXPECT_TRUE(contains(r.err, "loomrun: rank 2 was killed by SIGKILL (signal 9); stopping all ranks")) << r.err;
    EXPECT_TRUE(contains(r.err, "loomrun: exit status 137: rank 2 was killed by SIGKILL")) << r.err;
    for (auto& rank : pids)
        for (pid_t p : rank) EXPECT_FALSE(alive(p)) << "pid " << p << " outlived loomrun";
    EXPECT_LT(teardown, 10s);
    std::printf("[ measure  ] kill -9 of rank 2 of %d: loomrun exited, every process gone, after %.1f ms\n", kRanks,
                ms(teardown));
}

// SIGKILL to loomrun itself: the ranks die with it (PR_SET_PDEATHSIG) and its helper kills what they started
// (their process groups); nothing is left after 1 s.
TEST_F(Loomrun, KilledLoomrunLeavesNoRankBehind) {
    constexpr int kRanks = 4;
    std::vector<std::string> args = {"-n", std::to_string(kRanks)};
    args.insert(args.end(), kShellWithChild.begin(), kShellWithChild.end());
    Live job(args, {});
    auto pids = wait_for_pids(job, kRanks);
    ASSERT_FALSE(pids.empty()) << job.so_far().out << job.so_far().err;
    std::vector<pid_t> all;
    for (auto& rank : pids) all.insert(all.end(), rank.begin(), rank.end());
    for (pid_t p : all) ASSERT_TRUE(alive(p)) << p;
    ASSERT_EQ(::kill(job.pid(), SIGKILL), 0);
    const auto took = until_all_dead(all, 1s);
    EXPECT_EQ(job.reap().code, 128 + SIGKILL);
    for (pid_t p : all) EXPECT_FALSE(alive(p)) << "pid " << p << " survived its loomrun by 1 s";
    std::printf("[ measure  ] SIGKILL of loomrun with %d ranks: ranks and their children gone after %.1f ms\n", kRanks,
                ms(took));
}

// What a rank leaves running when it exits, in its process group or in a session of its own (setsid), is killed
// and reaped when the job ends: loomrun is a subreaper, so it adopts the latter.
TEST_F(Loomrun, LeftoversOfTheRanksAreStopped) {
    auto r = run_loomrun({"-n", "2", "/bin/sh", "-c", "setsid sleep 60 & a=$!; sleep 61 & echo \"pids $a $!\""});
    EXPECT_EQ(r.code, 0) << r.err;
    auto pids = rank_pids(r.out, "pids", 2);
    ASSERT_FALSE(pids.empty()) << r.out;
    for (auto& rank : pids) {
        ASSERT_EQ(rank.size(), 2u) << r.out;
        for (pid_t p : rank) EXPECT_FALSE(alive(p)) << "pid " << p << " outlived loomrun";
    }
    EXPECT_TRUE(contains(r.err, "killed what the ranks left running")) << r.err;
}

// A torch script runs under loomrun: torchrun's variables, with MASTER_PORT another port than Loom's store.
TEST_F(Loomrun, RanksGetTorchrunsVariables) {
    auto r = run_loomrun({"-n", "3", "/bin/sh", "-c",
                          "echo \"torch $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_PORT $LOOM_MASTER_PORT "
                          "$MASTER_ADDR\""});
    ASSERT_EQ(r.code, 0) << r.err;
    for (int rank = 0; rank < 3; ++rank) {
        auto at = r.out.find(fmt_rank(rank) + "torch ");
        ASSERT_NE(at, std::string::npos) << r.out;
        std::istringstream line(r.out.substr(at + fmt_rank(rank).size() + 6));
        int rk = -1, world = 0, local = -1, local_world = 0, torch_port = 0, loom_port = 0;
        std::string addr;
        line >> rk >> world >> local >> local_world >> torch_port >> loom_port >> addr;
        EXPECT_EQ(rk, rank);
        EXPECT_EQ(local, rank);
        EXPECT_EQ(world, 3);
        EXPECT_EQ(local_world, 3);
        EXPECT_EQ(addr, "127.0.0.1");
        EXPECT_GT(torch_port, 0);
        EXPECT_GT(loom_port, 0);
        EXPECT_NE(torch_port, loom_port) << "torch.distributed's store and Loom's would collide";
    }
    auto fixed =
        run_loomrun({"-n", "1", "--port", "23456", "/bin/sh", "-c", "echo ports $LOOM_MASTER_PORT $MASTER_PORT"});
    EXPECT_TRUE(contains(fixed.out, "[rank 0] ports 23456 ")) << fixed.out;
    EXPECT_FALSE(contains(fixed.out, "[rank 0] ports 23456 23456")) << fixed.out;
}

TEST_F(Loomrun, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
    // Rank 0 fails only once rank 1 ignores SIGTERM (bounded wait on a marker file), so the test cannot race.
    char dir[] = "/tmp/loomrun-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    const std::string ready = std::string(dir) + "/ignoring-term";
    auto r = run_loomrun({"-n", "2", "/bin/sh", "-c",
                          "if [ \"$LOOM_RANK\" = 0 ]; then for i in $(seq 100); do [ -e " + ready +
                              " ] && break; sleep 0.1; done; exit 2; fi; trap '' TERM; touch " + ready + "; sleep 60"});
    std::filesystem::remove_all(dir);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_GE(r.elapsed, 2500ms);
    EXPECT_LT(r.elapsed, 10s);
    EXPECT_TRUE(contains(r.err, "SIGKILL")) << r.err;
}

TEST_F(Loomrun, TimeoutEndsAllRanks) {
    auto r = run_loomrun({"-n", "2", "--timeout", "0.5", "/bin/sh", "-c", "sleep 60"});
    EXPECT_EQ(r.code, 124) << r.err;
    EXPECT_LT(r.elapsed, 8s);
    EXPECT_TRUE(contains(r.err, "timeout")) << r.err;
}

TEST_F(Loomrun, SigtermToLoomrunStopsTheRanks) {
    RunOpts opts;
    opts.signal_after = 300ms;
    auto r = run_loomrun({"-n", "2", "/bin/sh", "-c", "sleep 60"}, opts);
    EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
    EXPECT_LT(r.elapsed, 8s);
}

TEST_F(Loomrun, BadArguments) {
    EXPECT_NE(run_loomrun({"/bin/true"}).code, 0);  // no -n
    auto none = run_loomrun({"-n", "2"});
    EXPECT_NE(none.code, 0);
    EXPECT_TRUE(contains(none.err, "expected a program")) << none.err;
    auto missing = run_loomrun({"-n", "1", "/no/such/program"});
    EXPECT_EQ(missing.code, 127);
    EXPECT_TRUE(contains(missing.err, "[rank 0] loomrun: cannot execute '/no/such/program'")) << missing.err;
    auto gpus = run_loomrun({"-n", "1", "--gpus", "0,x", "/bin/true"});
    EXPECT_NE(gpus.code, 0);
    EXPECT_TRUE(contains(gpus.err, "--gpus")) << gpus.err;
}

// Stand-in tools: two GPUs from `nvidia-smi -L`, and an MPS control that records what it was asked to do.
class LoomrunFakeGpus : public Loomrun {
  protected:
    void SetUp() override {
        Loomrun::SetUp();
        if (fs::exists("/proc/driver/nvidia/gpus")) GTEST_SKIP() << "real NVIDIA driver present: fake GPUs not used";
        char templ[] = "/tmp/loomrun-test-XXXXXX";
        ASSERT_NE(::mkdtemp(templ), nullptr);
        dir_ = templ;
        fs::create_directory(dir_ / "with_mps");
        fs::create_directory(dir_ / "tmp");
        fs::create_directory(dir_ / "no_mps");
        log_ = dir_ / "mps.log";
        const std::string smi = "#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-a)'\necho 'GPU 1: Fake (UUID: GPU-b)'\n";
        write_script(dir_ / "with_mps/nvidia-smi", smi);
        write_script(dir_ / "no_mps/nvidia-smi", smi);
        write_script(dir_ / "with_mps/nvidia-cuda-mps-control",
                     "#!/bin/sh\n"
                     "if [ \"$1\" = -d ]; then echo \"start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY\" >> " +
                         log_.string() +
                         "; touch \"$CUDA_MPS_PIPE_DIRECTORY/control\"; exit 0; fi\n"
                         "read cmd; echo \"$cmd $CUDA_MPS_PIPE_DIRECTORY\" >> " +
                         log_.string() + "\n");
    }
    void TearDown() override {
        if (!dir_.empty()) fs::remove_all(dir_);
    }
    static void write_script(const fs::path& p, const std::string& text) {
        std::ofstream(p) << text;
        fs::permissions(p, fs::perms::owner_all);
    }
    RunOpts with_path(const std::string& sub) const {
        RunOpts o;
        // TMPDIR: the MPS directories, and the stale ones loomrun looks for, are this test's own.
        o.set = {{"PATH", (dir_ / sub).string() + ":/usr/bin:/bin"}, {"TMPDIR", (dir_ / "tmp").string()}};
        return o;
    }
    std::string log() const {
        std::ifstream f(log_);
        std::stringstream s;
        s << f.rdbuf();
        return s.str();
    }
    fs::path dir_, log_;
};

TEST_F(LoomrunFakeGpus, SharedGpusStartAndStopMps) {
    auto r =
        run_loomrun({"-n", "4", "/bin/sh", "-c",
                     "echo \"dev=$LOOM_DEVICE pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE pipe=$CUDA_MPS_PIPE_DIRECTORY\"; "
                     // Rank 3 fails only once every rank has printed (bounded), so no line is lost to the teardown.
                     "touch " +
                         (dir_ / "printed.").string() +
                         "$LOOM_RANK; "
                         "if [ \"$LOOM_RANK\" = 3 ]; then for i in $(seq 100); do "
                         "[ $(ls " +
                         (dir_ / "printed.").string() +
                         "* | wc -l) -ge 4 ] && break; sleep 0.1; done; exit 4; fi; "
                         "sleep 60"},
                    with_path("with_mps"));
    EXPECT_EQ(r.code, 4) << r.err;
    EXPECT_TRUE(contains(r.err, "MPS started")) << r.err;
    for (int rank = 0; rank < 4; ++rank)
        EXPECT_TRUE(contains(r.out, fmt_rank(rank) + "dev=" + std::to_string(rank % 2) + " pct=50 pipe=/")) << r.out;
    // Started once, with private directories, and told to quit with the same pipe directory on the failure path.
    std::string l = log();
    auto start = l.find("start ");
    ASSERT_NE(start, std::string::npos) << l;
    std::string pipe = l.substr(start + 6, l.find(' ', start + 6) - start - 6);
    EXPECT_TRUE(contains(l, "quit " + pipe)) << l;
    EXPECT_FALSE(fs::exists(pipe)) << "private MPS directory left behind";
    EXPECT_TRUE(contains(r.out, "pipe=" + pipe)) << r.out;
}

// Ranks sharing one GPU get CUDA_MPS_ACTIVE_THREAD_PERCENTAGE so that beyond two ranks some SMs stay unassigned
// (tools/loomrun/mps.cpp); a percentage the user set is passed through.
TEST_F(LoomrunFakeGpus, SharedGpuPercentageLeavesSmsUnassigned) {
    const std::pair<int, int> expected[] = {{2, 50}, {3, 26}, {4, 20}, {8, 12}};
    for (auto [n, pct] : expected) {
        auto r = run_loomrun(
            {"-n", std::to_string(n), "--gpus", "0", "/bin/sh", "-c", "echo pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"},
            with_path("with_mps"));
        EXPECT_EQ(r.code, 0) << r.err;
        for (int rank = 0; rank < n; ++rank)
            EXPECT_TRUE(contains(r.out, fmt_rank(rank) + "pct=" + std::to_string(pct))) << n << " ranks: " << r.out;
    }
    RunOpts user = with_path("with_mps");
    user.set.emplace_back("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25");
    auto r =
        run_loomrun({"-n", "4", "--gpus", "0", "/bin/sh", "-c", "echo pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}, user);
    EXPECT_TRUE(contains(r.out, fmt_rank(3) + "pct=25")) << r.out;
}

TEST_F(LoomrunFakeGpus, MpsStoppedWhenLoomrunIsInterrupted) {
    RunOpts opts = with_path("with_mps");
    opts.signal_after = 400ms;
    auto r = run_loomrun({"-n", "3", "/bin/sh", "-c", "sleep 60"}, opts);
    EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
    EXPECT_TRUE(contains(log(), "quit ")) << log();
}

// The pipe directory of the daemon started by the run that logged `log`.
std::string started_pipe(const std::string& log) {
    auto start = log.find("start ");
    if (start == std::string::npos) return "";
    return log.substr(start + 6, log.find(' ', start + 6) - start - 6);
}

// SIGKILL to loomrun after it started MPS: its helper stops the daemon and removes the directories.
TEST_F(LoomrunFakeGpus, MpsStoppedWhenLoomrunIsKilled) {
    Live job({"-n", "3", "/bin/sh", "-c", "echo \"pids $$\"; exec sleep 60"}, with_path("with_mps"));
    auto pids = wait_for_pids(job, 3);
    ASSERT_FALSE(pids.empty()) << job.so_far().out << job.so_far().err;
    const std::string pipe = started_pipe(log());
    ASSERT_FALSE(pipe.empty()) << log();
    ASSERT_TRUE(fs::exists(pipe + "/loomrun.owner"));
    ASSERT_EQ(::kill(job.pid(), SIGKILL), 0);
    job.reap();
    // Bounded wait for the helper (it runs the stand-in control program).
    for (auto t0 = Clock::now(); Clock::now() - t0 < 10s && !(contains(log(), "quit " + pipe) && !fs::exists(pipe));)
        std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(contains(log(), "quit " + pipe)) << log();
    EXPECT_FALSE(fs::exists(pipe)) << "private MPS directory left behind";
    for (auto& rank : pids) EXPECT_FALSE(alive(rank[0]));
}

// "pid start" of this process (/proc/self/stat fields 1 and 22), as loomrun.owner holds it.
std::pair<pid_t, unsigned long long> self_identity() {
    std::ifstream f("/proc/self/stat");
    std::string line;
    std::getline(f, line);
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 22; ++i) rest >> field;
    return {::getpid(), std::stoull(field)};
}

// A daemon left by a loomrun that is gone (its owner file names a process that has exited, or a pid now used by
// another process) is stopped, and its directories removed, when loomrun next starts; one whose owner still runs is
// left alone.
TEST_F(LoomrunFakeGpus, StaleMpsDaemonIsStoppedAtTheNextStart) {
    int n = 0;
    auto plant = [&](const std::string& owner) {
        const std::string id = std::to_string(n++);
        const fs::path pipe = dir_ / "tmp" / ("loomrun-mps-pipe-stale" + id),
                       logs = dir_ / "tmp" / ("loomrun-mps-log-stale" + id);
        fs::create_directory(pipe);
        fs::create_directory(logs);
        std::ofstream(pipe / "control") << "";
        std::ofstream(pipe / "loomrun.owner") << owner << "\n" << logs.string() << "\n";
        return std::pair{pipe, logs};
    };
    pid_t exited = ::fork();
    if (exited == 0) ::_exit(0);
    ASSERT_GT(exited, 0);
    ::waitpid(exited, nullptr, 0);
    auto [me, started] = self_identity();
    auto dead = plant(std::to_string(exited) + " 1");
    auto reused = plant(std::to_string(me) + " " + std::to_string(started + 1));
    auto live = plant(std::to_string(me) + " " + std::to_string(started));
    auto r = run_loomrun({"-n", "1", "/bin/true"}, with_path("with_mps"));
    EXPECT_EQ(r.code, 0) << r.err;
    for (auto& [pipe, logs] : {dead, reused}) {
        EXPECT_TRUE(contains(log(), "quit " + pipe.string())) << log();
        EXPECT_FALSE(fs::exists(pipe)) << pipe;
        EXPECT_FALSE(fs::exists(logs)) << logs;
    }
    EXPECT_TRUE(contains(r.err, "stopped the MPS daemon of loomrun pid " + std::to_string(exited))) << r.err;
    EXPECT_FALSE(contains(log(), "quit " + live.first.string())) << log();
    EXPECT_TRUE(fs::exists(live.first / "loomrun.owner"));
}

TEST_F(LoomrunFakeGpus, OneRankPerGpuNeedsNoMpsAndMissingMpsOnlyWarns) {
    auto one = run_loomrun({"-n", "2", "/bin/sh", "-c", "echo dev=$LOOM_DEVICE"}, with_path("with_mps"));
    EXPECT_EQ(one.code, 0) << one.err;
    EXPECT_TRUE(contains(one.err, "MPS not needed")) << one.err;
    EXPECT_TRUE(contains(one.out, "[rank 1] dev=1")) << one.out;
    EXPECT_EQ(log(), "");
    auto missing = run_loomrun({"-n", "4", "/bin/true"}, with_path("no_mps"));
    EXPECT_EQ(missing.code, 0) << missing.err;
    EXPECT_TRUE(contains(missing.err, "warning")) << missing.err;
    auto no_mps = run_loomrun({"-n", "4", "--no-mps", "/bin/true"}, with_path("with_mps"));
    EXPECT_EQ(no_mps.code, 0);
    EXPECT_EQ(log(), "");
    // CUDA_VISIBLE_DEVICES is honoured but left unchanged; --gpus picks among the visible devices.
    RunOpts cvd = with_path("with_mps");
    cvd.set.emplace_back("CUDA_VISIBLE_DEVICES", "1");
    auto one_visible =
        run_loomrun({"-n", "1", "/bin/sh", "-c", "echo dev=$LOOM_DEVICE cvd=$CUDA_VISIBLE_DEVICES"}, cvd);
    EXPECT_TRUE(contains(one_visible.out, "[rank 0] dev=0 cvd=1")) << one_visible.out;
    auto listed = run_loomrun({"-n", "2", "--gpus", "1", "--no-mps", "/bin/sh", "-c", "echo dev=$LOOM_DEVICE"},
                              with_path("with_mps"));
    EXPECT_TRUE(contains(listed.out, "[rank 0] dev=1")) << listed.out;
    EXPECT_TRUE(contains(listed.out, "[rank 1] dev=1")) << listed.out;
    auto bad = run_loomrun({"-n", "1", "--gpus", "2", "/bin/true"}, with_path("with_mps"));
    EXPECT_NE(bad.code, 0);
    EXPECT_TRUE(contains(bad.err, "device 2 is not visible")) << bad.err;
}

}  // namespace
