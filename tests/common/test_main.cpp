// World-aware GoogleTest main shared by every test binary.
#include <cstdlib>
#include <memory>

#include "common/test_env.hpp"

namespace loom::test {
namespace {
std::unique_ptr<World>& world_slot() {
    static std::unique_ptr<World> w;
    return w;
}
}  // namespace

World& world() {
    auto& w = world_slot();
    if (!w) w = std::make_unique<World>(World::from_env());
    return *w;
}

bool has_gpu() { return driver::available(); }

void world_slot_reset() { world_slot().reset(); }

}  // namespace loom::test

namespace loom::test {
void world_slot_reset();
}

namespace {
// Tears the World down after the last test, while the CUDA runtime is still alive.
class WorldTeardown : public ::testing::Environment {
  public:
    void TearDown() override { loom::test::world_slot_reset(); }
};
}  // namespace

int main(int argc, char** argv) {
    // Every wait is bounded in tests (20 s rather than the default 300 s: a hang is heard of sooner), and every
    // collective call is compared across ranks first.
    setenv("LOOM_WAIT_TIMEOUT_MS", "20000", /*overwrite=*/0);
    setenv("LOOM_CHECK_AGREEMENT", "1", /*overwrite=*/0);
    ::testing::InitGoogleTest(&argc, argv);
    const char* rank = std::getenv("LOOM_RANK");
    if (rank && std::atoi(rank) != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    ::testing::AddGlobalTestEnvironment(new WorldTeardown);
    return RUN_ALL_TESTS();
}
