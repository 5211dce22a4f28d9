// bench-collectives' nccl-tests command line (bench/nccl_args.hpp): sizes, the size series, type / reduction /
// collective names, bus-bandwidth factors and sizes per collective. CPU only.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/runtime/error.hpp"
#include "nccl_args.hpp"

namespace {

using loom::CollKind;
using loom::DType;
using loom::ReduceOp;
using namespace loom::bench;

constexpr std::size_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

// The loom::Error message of f(), or "" when it does not raise.
template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "";
}

// Parses `args` (after the program name) with the nccl-tests options registered; throws CLI::ParseError.
NcclArgs parse(std::vector<std::string> args) {
    CLI::App app{"test"};
    NcclArgs a;
    add_nccl_options(app, a);
    std::vector<const char*> argv{"bench"};
    for (const auto& s : args) argv.push_back(s.c_str());
    app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
    return a;
}

TEST(BenchArgs, SizesAsNcclTestsWritesThem) {
    EXPECT_EQ(parse_size("8", "-b"), 8u);
    EXPECT_EQ(parse_size("1K", "-b"), KiB);
    EXPECT_EQ(parse_size("1k", "-b"), KiB);
    EXPECT_EQ(parse_size("128M", "-e"), 128 * MiB);
    EXPECT_EQ(parse_size("1G", "-e"), GiB);
    EXPECT_EQ(parse_size("2GiB", "-e"), 2 * GiB);
    EXPECT_EQ(parse_size("4096", "-e"), 4096u);
}

TEST(BenchArgs, BadSizesNameTheFlagAndTheValue) {
    for (const char* bad : {"", "abc", "1X", "1.5M", "-1", "M"}) {
        const std::string msg = error_of([&] { parse_size(bad, "-b"); });
        EXPECT_NE(msg.find("-b"), std::string::npos) << bad << ": " << msg;
        EXPECT_NE(msg.find(std::string("\"") + bad + "\""), std::string::npos) << bad << ": " << msg;
    }
    const std::string zero = error_of([] { parse_size("0", "-e"); });
    EXPECT_NE(zero.find("at least 1 byte"), std::string::npos) << zero;
    EXPECT_NE(error_of([] { parse_size("99999999999999999999", "-e"); }).find("out of range"), std::string::npos);
}

TEST(BenchArgs, SizeSeries) {
    const auto s = size_series(8, 128 * MiB, 2);
    ASSERT_EQ(s.size(), 25u);
    EXPECT_EQ(s.front(), 8u);
    EXPECT_EQ(s[1], 16u);
    EXPECT_EQ(s.back(), 128 * MiB);
    EXPECT_EQ(size_series(KiB, GiB, 4).size(), 11u);
    EXPECT_EQ(size_series(KiB, 3 * KiB, 2), (std::vector<std::size_t>{KiB, 2 * KiB}));
    EXPECT_EQ(size_series(32 * MiB, 32 * MiB, 1), (std::vector<std::size_t>{32 * MiB}));
    EXPECT_EQ(size_series(32 * MiB, 32 * MiB, 2), (std::vector<std::size_t>{32 * MiB}));
    // Near the top of size_t the series stops instead of wrapping around.
    const std::size_t top = ~std::size_t{0};
    EXPECT_EQ(size_series(top / 2, top, 2).size(), 2u);
    EXPECT_NE(error_of([] { size_series(KiB, MiB, 1); }).find("-f (step factor)"), std::string::npos);
    EXPECT_NE(error_of([] { size_series(MiB, KiB, 2); }).find("-b (min bytes) <= -e (max bytes)"), std::string::npos);
}

TEST(BenchArgs, FlagsAsNcclTestsSpellsThem) {
    const NcclArgs a = parse({"-b", "8",  "-e", "128M", "-f", "2",      "-d", "half,bfloat16", "-o", "max", "-n",
                              "50", "-w", "3",  "-c",   "0",  "--runs", "3",  "--seed",        "42"});
    EXPECT_EQ(a.min_bytes, 8u);
    EXPECT_EQ(a.max_bytes, 128 * MiB);
    EXPECT_EQ(a.step_factor, 2);
    EXPECT_EQ(a.dtypes, (std::vector<std::string>{"half", "bfloat16"}));
    EXPECT_EQ(a.redops, (std::vector<std::string>{"max"}));
    EXPECT_EQ(a.iters, 50);
    EXPECT_EQ(a.warmup, 3);
    EXPECT_EQ(a.check, 0);
    EXPECT_EQ(a.runs, 3);
    EXPECT_EQ(a.seed, 42u);
    // Long names: nccl-tests' and the JSON sweep's.
    const NcclArgs l = parse({"--minbytes", "1K", "--max-bytes", "1G", "--stepfactor", "4", "--datatype", "float"});
    EXPECT_EQ(l.min_bytes, KiB);
    EXPECT_EQ(l.max_bytes, GiB);
    EXPECT_EQ(l.step_factor, 4);
    const NcclArgs d = parse({});
    EXPECT_EQ(d.min_bytes, 8u);
    EXPECT_EQ(d.max_bytes, 128 * MiB);
    EXPECT_EQ(d.dtypes, (std::vector<std::string>{"float"}));
    EXPECT_EQ(d.check, 1);
}

TEST(BenchArgs, BadFlagsAreParseErrors) {
    try {
        parse({"-b", "1X"});
        ADD_FAILURE() << "-b 1X parsed";
    } catch (const CLI::ParseError& e) {
        EXPECT_NE(std::string(e.what()).find("-b"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("1X"), std::string::npos) << e.what();
    }
    EXPECT_THROW(parse({"-c", "2"}), CLI::ParseError);
    EXPECT_THROW(parse({"-n", "0"}), CLI::ParseError);
    EXPECT_THROW(parse({"-e", "0"}), CLI::ParseError);
    EXPECT_THROW(parse({"-t", "all_reduce"}), CLI::ParseError);  // registered by bench-collectives itself
}

TEST(BenchArgs, TypeNames) {
    EXPECT_EQ(parse_dtype("float"), DType::F32);
    EXPECT_EQ(parse_dtype("half"), DType::F16);
    EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
    EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
    EXPECT_EQ(parse_dtype("f8e4m3"), DType::F8E4M3);
    EXPECT_EQ(parse_dtype("int32"), DType::I32);
    EXPECT_EQ(parse_dtype("int64"), DType::I64);
    EXPECT_EQ(parse_dtype("uint8"), DType::U8);
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::I32, DType::I64, DType::U8})
        EXPECT_EQ(parse_dtype(nccl_type_name(t)), t) << nccl_type_name(t);
    const std::string dbl = error_of([] { parse_dtype("double"); });
    EXPECT_NE(dbl.find("-d (datatype): double is an nccl-tests type Loom's collectives do not take"), std::string::npos)
        << dbl;
    EXPECT_NE(error_of([] { parse_dtype("floot"); }).find("given \"floot\""), std::string::npos);
}

TEST(BenchArgs, ReductionAndCollectiveNames) {
    EXPECT_EQ(parse_redop("sum"), ReduceOp::Sum);
    EXPECT_EQ(parse_redop("MAX"), ReduceOp::Max);
    const std::string prod = error_of([] { parse_redop("prod"); });
    EXPECT_NE(prod.find("-o (op): Loom's collectives reduce with sum or max only, given \"prod\""), std::string::npos)
        << prod;
    EXPECT_NE(error_of([] { parse_redop("add"); }).find("expected sum, max or all"), std::string::npos);
    EXPECT_EQ(parse_coll("all_reduce"), CollKind::AllReduce);
    EXPECT_EQ(parse_coll("allreduce"), CollKind::AllReduce);
    EXPECT_EQ(parse_coll("all_reduce_perf"), CollKind::AllReduce);
    EXPECT_EQ(parse_coll("allgather"), CollKind::AllGather);
    EXPECT_EQ(parse_coll("reduce_scatter"), CollKind::ReduceScatter);
    EXPECT_EQ(parse_coll("alltoall_perf"), CollKind::AllToAll);
    EXPECT_NE(error_of([] { parse_coll("broadcast"); }).find("given \"broadcast\""), std::string::npos);
}

TEST(BenchArgs, TypeOpsPerCollective) {
    NcclArgs a;
    a.dtypes = {"all"};
    a.redops = {"all"};
    const auto ar = type_ops(CollKind::AllReduce, a);
    ASSERT_EQ(ar.size(), 6u);  // float, half, bfloat16 x sum, max
    for (const auto& t : ar) EXPECT_TRUE(reducible(t.dtype));
    EXPECT_EQ(ar[0].op_name, "sum");
    EXPECT_EQ(ar[1].op_name, "max");
    const auto ag = type_ops(CollKind::AllGather, a);
    ASSERT_EQ(ag.size(), 7u);  // every type, once, no reduction
    for (const auto& t : ag) EXPECT_EQ(t.op_name, "none");
    a.dtypes = {"int32"};
    a.redops = {"sum"};
    EXPECT_EQ(type_ops(CollKind::AllToAll, a).size(), 1u);
    const std::string msg = error_of([&] { type_ops(CollKind::ReduceScatter, a); });
    EXPECT_NE(msg.find("reduce_scatter reduces float, half or bfloat16 only, given \"int32\""), std::string::npos)
        << msg;
    a.dtypes = {"float"};
    a.redops = {"prod"};  // rejected even where no reduction runs: the flag is wrong either way
    EXPECT_NE(error_of([&] { type_ops(CollKind::AllGather, a); }).find("given \"prod\""), std::string::npos);
}

TEST(BenchArgs, BusBandwidthFactorsAsNcclTests) {
    EXPECT_DOUBLE_EQ(bus_factor(CollKind::AllReduce, 8), 2.0 * 7 / 8);
    EXPECT_DOUBLE_EQ(bus_factor(CollKind::AllReduce, 2), 1.0);
    EXPECT_DOUBLE_EQ(bus_factor(CollKind::AllGather, 8), 7.0 / 8);
    EXPECT_DOUBLE_EQ(bus_factor(CollKind::ReduceScatter, 4), 3.0 / 4);
    EXPECT_DOUBLE_EQ(bus_factor(CollKind::AllToAll, 2), 0.5);
    EXPECT_DOUBLE_EQ(bus_factor(CollKind::AllReduce, 1), 0.0);
    EXPECT_THROW(bus_factor(CollKind::AllReduce, 0), loom::Error);
    EXPECT_DOUBLE_EQ(algbw_gbps(1e9, 1e6), 1.0);  // 1 GB in 1 s
    EXPECT_DOUBLE_EQ(algbw_gbps(128.0 * MiB, 1000.0), 128.0 * MiB / 1e6);
}

TEST(BenchArgs, SizesPerCollective) {
    // all_gather: the size is out's; each rank sends a W-th.
    CollSize s = coll_size(CollKind::AllGather, MiB, DType::F32, 8);
    EXPECT_EQ(s.bytes, MiB);
    EXPECT_EQ(s.count, MiB / 4);
    EXPECT_EQ(s.chunk, MiB / 32);
    EXPECT_EQ(s.in_count, s.chunk);
    EXPECT_EQ(s.out_count, s.count);
    // reduce_scatter: the size is in's.
    s = coll_size(CollKind::ReduceScatter, MiB, DType::BF16, 4);
    EXPECT_EQ(s.in_count, MiB / 2);
    EXPECT_EQ(s.out_count, MiB / 8);
    // all_reduce: whole elements.
    s = coll_size(CollKind::AllReduce, 10, DType::F32, 8);
    EXPECT_EQ(s.bytes, 8u);
    EXPECT_EQ(s.count, 2u);
    // Chunked ops round down to W equal chunks; too small for one element each gives 0.
    s = coll_size(CollKind::AllToAll, 100, DType::F32, 8);
    EXPECT_EQ(s.bytes, 96u);
    EXPECT_EQ(s.chunk, 3u);
    EXPECT_EQ(coll_size(CollKind::AllGather, 16, DType::F32, 8).count, 0u);
}

}  // namespace
