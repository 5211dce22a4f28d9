// loomrun: start N ranks of a program on this host, like torchrun --standalone.
//
//   loomrun -n N [--gpus LIST] [--port P] [--no-mps] [--timeout S] prog args...
//
// Each rank gets LOOM_RANK, LOOM_WORLD_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_WORLD_SIZE, LOOM_MASTER_ADDR,
// LOOM_MASTER_PORT, LOOM_DEVICE (its GPU, round-robin over the visible GPUs or --gpus; CUDA_VISIBLE_DEVICES
// is left as it is so ranks on different GPUs can map each other's memory), LOOM_JOB_SECRET (256 random bits
// from /dev/urandom, fresh per job: only the job's ranks can join its bootstrap store), torchrun's RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (another free port than Loom's, for
// torch.distributed's own store), plus NCCL_NVLS_ENABLE=0 and NVSHMEM_DISABLE_NVLS=1 (NVLink multicast is never
// used). Ranks sharing a GPU run under MPS (see mps.hpp). Ranks die with loomrun, even a SIGKILLed one
// (launcher.hpp, sweeper.hpp). The launcher never initialises CUDA itself.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

#include "gpus.hpp"
#include "launcher.hpp"
#include "loom/version.hpp"
#include "mps.hpp"
#include "sweeper.hpp"

namespace {

// A loopback port that is free now, held by the returned socket until it is closed.
std::pair<int, int> hold_free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("socket() failed while picking a port");
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
        ::close(fd);
        throw std::runtime_error("cannot find a free port; pass --port");
    }
    return {fd, ntohs(sa.sin_port)};
}

// Free loopback ports for Loom's store (`given`, else a free one) and for torch.distributed's (MASTER_PORT), distinct:
// each is held while the next is picked. Rank 0 of each binds its port moments later.
std::pair<int, int> pick_ports(int given) {
    auto [fd1, first] = hold_free_port();
    auto [fd2, second] = hold_free_port();
    ::close(fd1);
    ::close(fd2);
    if (!given) return {first, second};
    return {given, first != given ? first : second};
}

// A fresh job secret: 32 bytes of /dev/urandom as 64 hex characters.
std::string random_secret() {
    unsigned char raw[32];
    FILE* f = std::fopen("/dev/urandom", "rb");
    const bool ok = f && std::fread(raw, 1, sizeof raw, f) == sizeof raw;
    if (f) std::fclose(f);
    if (!ok) throw std::runtime_error("cannot read /dev/urandom for the job secret");
    std::string hex;
    for (unsigned char b : raw) hex += fmt::format("{:02x}", b);
    return hex;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"loomrun: start N ranks of a program on this host (one process per rank)"};
    int nranks = 0;
    std::string gpus;
    int port = 0;
    bool no_mps = false;
    double timeout_s = 0;
    std::string profile_dir;
    app.add_option("-n,--nproc", nranks, "number of ranks")->required()->check(CLI::Range(1, 4096));
    app.add_option("--gpus", gpus, "comma-separated device indices to spread the ranks over (default: all visible)");
    app.add_option("--port", port, "rendezvous port for rank 0's store (default: a free port)")
        ->check(CLI::Range(1, 65535));
    app.add_flag("--no-mps", no_mps, "do not start an MPS daemon when ranks share a GPU");
    app.add_option("--timeout", timeout_s, "stop all ranks and exit 124 after this many seconds (0: never)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--profile", profile_dir,
                   "profile the ranks' kernels and write one Chrome-trace JSON per World into DIR (LOOM_PROFILE)")
        ->type_name("DIR");
    app.set_version_flag("--version", std::string("loomrun ") + loom::version());
    app.prefix_command();  // everything from the program name on belongs to the program
    app.footer("Example: loomrun -n 4 build/tests/loom_dist_tests --gtest_filter='AllGather*'");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    std::vector<std::string> command = app.remaining();
    if (!command.empty() && command.front() == "--") command.erase(command.begin());
    if (command.empty()) {
        std::fprintf(stderr, "loomrun: expected a program to run after the options\n%s", app.help().c_str());
        return 2;
    }

    ::signal(SIGPIPE, SIG_IGN);  // a reader or helper that went away is an error to handle, not a reason to die
    try {
        // First, so that whatever loomrun starts from here on is cleaned up even when loomrun is SIGKILLed.
        loomrun::Sweeper sweeper;
        const int physical = loomrun::physical_gpu_count();
        const int visible = loomrun::visible_gpu_count(physical, std::getenv("CUDA_VISIBLE_DEVICES"));
        loomrun::LaunchSpec spec;
        spec.command = command;
        spec.nranks = nranks;
        spec.devices = loomrun::gpu_list(gpus, visible);
        std::tie(spec.port, spec.torch_port) = pick_ports(port);
        spec.on_start = [&sweeper](pid_t pgid) { sweeper.watch_group(pgid); };
        if (sweeper.pid() > 0) spec.helpers.push_back(sweeper.pid());
        spec.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
        spec.common = {{"NCCL_NVLS_ENABLE", "0"}, {"NVSHMEM_DISABLE_NVLS", "1"}, {"LOOM_JOB_SECRET", random_secret()}};
        if (!profile_dir.empty()) {
            std::filesystem::create_directories(profile_dir);
            spec.common.push_back({"LOOM_PROFILE", std::filesystem::absolute(profile_dir).string()});
        }

        // Ranks per GPU: the most ranks any one device gets under the round-robin assignment.
        const int used = std::min<int>(nranks, static_cast<int>(spec.devices.size()));
        const int ranks_per_gpu = used ? (nranks + used - 1) / used : 0;
        // A device listed twice in --gpus is shared too.
        std::vector<int> per_device(std::max(visible, 1), 0);
        int most = 0;
        for (int r = 0; r < nranks && !spec.devices.empty(); ++r)
            most = std::max(most, ++per_device[spec.devices[r % spec.devices.size()]]);
        loomrun::Mps mps(std::max(ranks_per_gpu, most), no_mps, spec.devices.empty());
        for (auto& kv : mps.rank_env()) spec.common.push_back(kv);
        int code = loomrun::run_job(spec);
        mps.stop();
        sweeper.release();
        return code;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "loomrun: %s\n", e.what());
        return 1;
    }
}
