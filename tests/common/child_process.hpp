// Runs a case of the child helper (tests/helpers/loom_test_child.cpp) for tests whose subject ends the process (a
// trapped kernel).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loom::test {

struct ChildResult {
    int status = -1;     // exit code, or 128 + signal
    std::string output;  // stdout and stderr, interleaved
};

// The helper binary loom_test_child, beside the running test binary.
std::string child_helper_path();

// fork + exec of loom_test_child (beside this test binary) with argument `which` and `env` added to the environment.
// outside_mps: the child runs outside loomrun's MPS server (a trap in an MPS client would fault every client of the
// GPU); false: it inherits this process's MPS server (a child that ends by a host signal, not a trap).
// Bounded: a child still running after `timeout_s` is killed and the output says so.
ChildResult run_child(const std::string& which, const std::vector<std::pair<std::string, std::string>>& env,
                      int timeout_s = 180, bool outside_mps = true);

}  // namespace loom::test
