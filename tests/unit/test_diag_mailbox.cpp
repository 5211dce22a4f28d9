// The diagnostic mailbox without a GPU: decoding of records (what the loom::Error of a timed-out wait will say),
// and the compile-side contract of LOOM_NO_DEVICE_PRINTF: a kernel that waits inside a wgmma loop compiles with
// no printf call and no wgmma serialisation, while the same kernel with printf is serialised (the control that
// shows the check can fail). The GPU side runs in tests/dist/test_diag_mailbox.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "runtime/diag_mailbox.hpp"

namespace {

using loom::DiagKind;
using loom::DiagMailbox;
using loom::DiagRecord;

DiagRecord record(DiagKind kind, int rank, const char* tag) {
    DiagRecord r{};
    r.state = loom::kDiagRecordComplete;
    r.rank = rank;
    r.block[0] = 3;
    r.thread = 128;
    r.kind = static_cast<uint32_t>(kind);
    r.smid = 17;
    std::strncpy(r.tag, tag, sizeof r.tag - 1);
    return r;
}

TEST(DiagMailbox, DecodesSignalWait) {
    DiagRecord r = record(DiagKind::Signal, 1, "gemm.full_barrier");
    r.cmp = 2;  // lang::Cmp::GE
    r.addr = 0x7f0000001000;
    r.expected = 5;
    r.observed = 4;
    r.elapsed = 20000ull * 1000000ull + 999999;
    EXPECT_EQ(loom::diag::format_record(r, 7),
              "wait timeout: rank 1 block (3,0,0) thread 128 tag gemm.full_barrier at 0x7f0000001000 expected >= 5 "
              "observed 4 after 20000 ms (sm 17)");
    for (uint32_t c = 0; c < 6; ++c) {
        r.cmp = c;
        const char* want[] = {" == ", " != ", " >= ", " > ", " <= ", " < "};
        EXPECT_NE(loom::diag::format_record(r, 0).find(std::string("expected") + want[c] + "5"), std::string::npos)
            << c;
    }
}

TEST(DiagMailbox, DecodesMbarrierWaitWithTheWorldsRank) {
    DiagRecord r = record(DiagKind::Mbarrier, -1, "pipeline full");
    r.addr = 0x400;
    r.expected = 1;
    r.observed = 0x8000000000000001ull;
    r.elapsed = 1ull << 35;
    EXPECT_EQ(loom::diag::format_record(r, 6),
              "wait timeout: rank 6 block (3,0,0) thread 128 tag pipeline full at 0x400 (mbarrier) expected the phase "
              "with parity 1 to complete, barrier word 0x8000000000000001 after 34359738368 cycles (sm 17)");
}

TEST(DiagMailbox, DecodesBadPeer) {
    DiagRecord r = record(DiagKind::BadPeer, 2, "symm_at");
    r.addr = 0x1234;
    r.expected = 9;
    r.observed = 0 | (4ull << 32);  // local ranks 0..3
    EXPECT_EQ(loom::diag::format_record(r, 0),
              "symm_at: rank 2 block (3,0,0) thread 128: peer 9 is not load/store reachable (local ranks 0..3) or "
              "0x1234 is not in this rank's symmetric heap (sm 17)");
}

TEST(DiagMailbox, DecodesBadIndex) {
    DiagRecord r = record(DiagKind::BadIndex, 1, "moe_route topk_idx");
    r.addr = 0x2000;
    r.expected = 8;
    r.observed = static_cast<uint64_t>(int64_t{-3});
    EXPECT_EQ(loom::diag::format_record(r, 0),
              "bad index: rank 1 block (3,0,0) thread 128 tag moe_route topk_idx: index -3 read at 0x2000 is out of "
              "range [0, 8) (sm 17)");
}

TEST(DiagMailbox, TagIsBoundedAndPrintable) {
    DiagRecord r = record(DiagKind::Signal, 0, "");
    std::memset(r.tag, 'x', sizeof r.tag);  // no NUL at all: the decoder must stop at the field's end
    r.tag[3] = '\n';
    const std::string s = loom::diag::format_record(r, 0);
    const std::string want = "tag xxx?" + std::string(loom::kDiagTagBytes - 4, 'x') + " at ";
    EXPECT_NE(s.find(want), std::string::npos) << s;
    DiagRecord empty = record(DiagKind::Signal, 0, "");
    EXPECT_NE(loom::diag::format_record(empty, 0).find("tag (none) at"), std::string::npos);
}

TEST(DiagMailbox, UnknownKindIsStillReported) {
    DiagRecord r = record(static_cast<DiagKind>(42), 0, "t");
    EXPECT_NE(loom::diag::format_record(r, 0).find("unknown kind 42"), std::string::npos);
}

TEST(DiagMailbox, MailboxListsCompleteRecordsAndCountsTheRest) {
    auto m = std::make_unique<DiagMailbox>();
    std::memset(m.get(), 0, sizeof *m);
    EXPECT_EQ(loom::diag::format_mailbox(*m, 0), "") << "no magic: not initialised, nothing to say";
    m->magic = loom::kDiagMagic;
    m->capacity = loom::kDiagRecords;
    EXPECT_EQ(loom::diag::format_mailbox(*m, 0), "");

    m->records[0] = record(DiagKind::Signal, 0, "first");
    m->records[2] = record(DiagKind::Mbarrier, -1, "third");
    m->records[1] = record(DiagKind::Signal, 0, "torn");
    m->records[1].state = 0;  // claimed, not completed when the kernel stopped
    m->claimed = 3;
    std::string s = loom::diag::format_mailbox(*m, 5);
    EXPECT_NE(s.find("  wait timeout: rank 0 block (3,0,0) thread 128 tag first"), std::string::npos) << s;
    EXPECT_NE(s.find("\n  wait timeout: rank 5 block (3,0,0) thread 128 tag third"), std::string::npos) << s;
    EXPECT_EQ(s.find("torn"), std::string::npos) << s;
    EXPECT_NE(s.find("(1 record(s) claimed but not completed"), std::string::npos) << s;
    EXPECT_EQ(s.find("more timed-out"), std::string::npos) << s;

    m->claimed = loom::kDiagRecords + 120;
    s = loom::diag::format_mailbox(*m, 5);
    EXPECT_NE(s.find("(120 more timed-out wait(s) not recorded: the mailbox holds 8)"), std::string::npos) << s;
}

TEST(DiagMailbox, OnlyStickyDeviceErrorsCarryTheReport) {
    for (int code : {700, 702, 710, 714, 715, 716, 717, 718, 719})
        EXPECT_TRUE(loom::diag::is_sticky_device_error(code));
    for (int code : {0, 1, 2, 98, 200, 400, 999}) EXPECT_FALSE(loom::diag::is_sticky_device_error(code));
    // No World in this process: no mailbox, nothing appended, never a throw.
    EXPECT_EQ(loom::diag::report(), "");
    EXPECT_EQ(loom::diag::report_for_error(719), "");
    try {
        LOOM_CHECK_CUDA(719);
        FAIL() << "expected a loom::Error";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("cudaErrorLaunchFailure"), std::string::npos) << e.what();
        EXPECT_EQ(std::string(e.what()).find("device diagnostics"), std::string::npos) << e.what();
    }
}

// ---- compile-side contract ----------------------------------------------------------------------------------

loom::jit::CompileResult compile_diag(const std::string& kernel, bool with_printf, int arch) {
    loom::jit::KernelSpec spec;
    spec.header = LOOM_SOURCE_DIR "/tests/dist/kernels/diag_test.cuh";
    spec.name = kernel;
    if (with_printf) spec.defines.push_back("LOOM_DIAG_TEST_WITH_PRINTF");
    return loom::jit::compile(spec, arch);
}

bool calls_printf(const loom::jit::CompileResult& r) {
    const std::string needle = "vprintf";
    return std::search(r.cubin.begin(), r.cubin.end(), needle.begin(), needle.end()) != r.cubin.end();
}

bool serialised(const loom::jit::CompileResult& r) {
    return r.resource_report.find("C7510") != std::string::npos || r.log.find("C7510") != std::string::npos;
}

TEST(DiagMailboxCompile, NoPrintfWaitsKeepWgmmaAsync) {
    const auto quiet = compile_diag("loom_diag_test::wgmma_with_waits", false, 90);
    EXPECT_FALSE(quiet.cubin.empty());
    EXPECT_FALSE(calls_printf(quiet)) << quiet.resource_report;
    EXPECT_FALSE(serialised(quiet)) << quiet.log << "\n" << quiet.resource_report;
    EXPECT_EQ(quiet.spill_bytes, 0) << quiet.resource_report;

    // Control: the same kernel with printf in its waits' cold paths calls vprintf and is serialised.
    const auto loud = compile_diag("loom_diag_test::wgmma_with_waits", true, 90);
    EXPECT_TRUE(calls_printf(loud)) << loud.resource_report;
    EXPECT_TRUE(serialised(loud)) << loud.log << "\n" << loud.resource_report;
}

TEST(DiagMailboxCompile, TimeoutKernelsCompileWithAndWithoutPrintf) {
    for (int arch : {90, 80}) {
        SCOPED_TRACE("sm_" + std::to_string(arch));
        const auto quiet = compile_diag("loom_diag_test::missing_notify", false, arch);
        EXPECT_FALSE(calls_printf(quiet));
        const auto loud = compile_diag("loom_diag_test::missing_notify", true, arch);
        EXPECT_TRUE(calls_printf(loud)) << "the default keeps the printed diagnostic";
    }
    const auto stall = compile_diag("loom_diag_test::pipeline_stall", false, 90);
    EXPECT_FALSE(calls_printf(stall));
    EXPECT_FALSE(stall.cubin.empty());
}

}  // namespace
