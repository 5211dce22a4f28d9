// The diagnostic mailbox on the GPU: a timed-out wait in a kernel compiled with LOOM_NO_DEVICE_PRINTF (no device
// printf at all) still ends in a loom::Error that names who waited for what, decoded from the mailbox. The kernel
// runs in a child process of rank 0 (loom_test_child diag-missing-notify: a trap leaves the context unusable), with
// a one-rank World of its own and outside loomrun's MPS server.
#include <string>

#include "common/child_process.hpp"
#include "common/test_env.hpp"

namespace {

std::size_t count(const std::string& s, const std::string& part) {
    std::size_t n = 0;
    for (auto p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
    return n;
}

TEST(DiagMailboxGpu, NoPrintfMissingNotifyEndsInDecodedRecord) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    if (w.rank() == 0) {
        const auto [status, output] = loom::test::run_child("diag-missing-notify", {{"LOOM_WAIT_TIMEOUT_MS", "300"}});
        EXPECT_EQ(status, 3) << output;
        const std::string rec = "wait timeout: rank 0 block (0,0,0) thread 0 tag wait at 0x";
        // Once in the loom::Error of cudaDeviceSynchronize, once in the World's shutdown warning.
        EXPECT_GE(count(output, rec), 2u) << output;
        EXPECT_NE(output.find("expected >= 1 observed 0 after "), std::string::npos) << output;
        EXPECT_NE(output.find("cudaDeviceSynchronize() failed"), std::string::npos) << output;
        EXPECT_NE(output.find("device diagnostics (loom mailbox)"), std::string::npos) << output;
        EXPECT_EQ(output.find("loom: wait timeout"), std::string::npos) << "a LOOM_NO_DEVICE_PRINTF kernel printed\n"
                                                                        << output;
    }
    w.barrier("diag-missing-notify");
}

}  // namespace
