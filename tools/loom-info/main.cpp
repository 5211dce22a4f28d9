// loom-info: GPU/driver probe. `--has-gpu` exits 0 when a GPU is usable, else prints why and exits 1.
#include <cstdio>
#include <cstring>

#include "loom/runtime/driver.hpp"

int main(int argc, char** argv) {
    bool has_gpu_only = argc > 1 && std::strcmp(argv[1], "--has-gpu") == 0;
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    if (has_gpu_only) {
        std::printf("GPU present\n");
        return 0;
    }
    std::printf("GPU present\n");
    return 0;
}
