// World-aware GoogleTest main shared by every test binary.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/test_env.hpp"

namespace loom::test {
namespace {
std::unique_ptr<World>& world_slot() {
    static std::unique_ptr<World> w;
    return w;
}
WorldOptions& world_options() {
    static WorldOptions o;
    return o;
}
}  // namespace

World& world() {
    auto& w = world_slot();
    if (!w) w = std::make_unique<World>(World::from_env(world_options()));
    return *w;
}

void set_coll_scratch(std::size_t bytes) { world_options().coll_scratch = bytes; }

bool has_gpu() { return driver::available(); }

void world_slot_reset() { world_slot().reset(); }

}  // namespace loom::test

namespace loom::test {
void world_slot_reset();
void set_coll_scratch(std::size_t bytes);
}  // namespace loom::test

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
    // --coll-scratch=SIZE (after GoogleTest's own flags): the shared World's WorldOptions::coll_scratch, e.g. 1M to run
    // every collective round loop through many rounds.
    for (int i = 1; i < argc; ++i)
        if (std::strncmp(argv[i], "--coll-scratch=", 15) == 0)
            loom::test::set_coll_scratch(loom::parse_bytes(argv[i] + 15, "--coll-scratch"));
    const char* rank = std::getenv("LOOM_RANK");
    if (rank && std::atoi(rank) != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    ::testing::AddGlobalTestEnvironment(new WorldTeardown);
    return RUN_ALL_TESTS();
}
