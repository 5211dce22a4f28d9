// A kernel that must not compile: the JIT error test checks that the error names it and carries the log.
#pragma once

namespace jit_test {

template <int N>
__global__ void broken(int* out) {
    out[0] = N + loom_jit_test_undeclared_identifier;
}

}  // namespace jit_test
