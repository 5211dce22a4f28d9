# Third-party dependencies. Each is the system's package (find_package) when one of at least the floor version is
# installed, else the pinned release below, downloaded at configure time and built with Loom (FetchContent, checked
# against its SHA-256). CMAKE_DISABLE_FIND_PACKAGE_<Name>=ON skips the system's package; with no network,
# FETCHCONTENT_SOURCE_DIR_<NAME>=<dir> builds a local copy of the same release instead.
#
#   package         floor   fallback release      used by
#   fmt             9.1     9.1.0                 libloom (public, header-only) and everything
#   nlohmann_json   3.11    3.11.3                libloom (private), tools, tests, benchmarks
#   CLI11           2.1     2.4.2                 tools, benchmarks
#   GTest           1.12    1.14.0                tests
include(FetchContent)

# The fallback fmt is installed with Loom: libloom's exported target links fmt::fmt-header-only.
set(FMT_INSTALL ON CACHE BOOL "Install fmt with Loom (only when fmt is built as Loom's fallback)")
FetchContent_Declare(fmt
  URL https://github.com/fmtlib/fmt/releases/download/9.1.0/fmt-9.1.0.zip
  URL_HASH SHA256=cceb4cb9366e18a5742128cb3524ce5f50e88b476f1e54737a47ffdf4df4c996
  DOWNLOAD_EXTRACT_TIMESTAMP ON
  FIND_PACKAGE_ARGS 9.1)

set(JSON_Install OFF CACHE BOOL "Install nlohmann_json with Loom (only when built as Loom's fallback)")
FetchContent_Declare(nlohmann_json
  URL https://github.com/nlohmann/json/releases/download/v3.11.3/json.tar.xz
  URL_HASH SHA256=d6c65aca6b1ed68e7a182f4757257b107ae403032760ed6ef121c9d55e81757d
  DOWNLOAD_EXTRACT_TIMESTAMP ON
  FIND_PACKAGE_ARGS 3.11)

set(CLI11_INSTALL OFF CACHE BOOL "Install CLI11 with Loom (only when built as Loom's fallback)")
FetchContent_Declare(CLI11
  URL https://github.com/CLIUtils/CLI11/archive/refs/tags/v2.4.2.tar.gz
  URL_HASH SHA256=f2d893a65c3b1324c50d4e682c0cdc021dd0477ae2c048544f39eed6654b699a
  DOWNLOAD_EXTRACT_TIMESTAMP ON
  FIND_PACKAGE_ARGS 2.1)

set(INSTALL_GTEST OFF CACHE BOOL "Install GoogleTest with Loom (only when built as Loom's fallback)")
set(BUILD_GMOCK OFF CACHE BOOL "Build GoogleMock (Loom's tests do not use it)")
FetchContent_Declare(googletest
  URL https://github.com/google/googletest/archive/refs/tags/v1.14.0.tar.gz
  URL_HASH SHA256=8ad598c73ad796e0d8280b082cebd82a630d73e73cd3c70057938a6501bba5d7
  DOWNLOAD_EXTRACT_TIMESTAMP ON
  FIND_PACKAGE_ARGS 1.12 NAMES GTest)

FetchContent_MakeAvailable(fmt nlohmann_json)
if(LOOM_BUILD_TOOLS OR LOOM_BUILD_BENCH OR LOOM_BUILD_TESTS)  # tests: the benchmarks' flags (bench/nccl_args.cpp)
  FetchContent_MakeAvailable(CLI11)
endif()
if(LOOM_BUILD_TESTS)
  FetchContent_MakeAvailable(googletest)
endif()
