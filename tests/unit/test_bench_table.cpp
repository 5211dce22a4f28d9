// The benchmarks' text tables (bench/table.hpp): the aligned table of bench-gemm / bench-overlap and nccl-tests'
// table of bench-collectives, checked character for character. CPU only.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "loom/runtime/error.hpp"
#include "table.hpp"

namespace {

using namespace loom::bench;

std::vector<std::string> lines(const std::string& s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

// The column (0-based) where the `n`-th whitespace-separated field of `line` ends (one past its last character).
std::size_t field_end(const std::string& line, int n) {
    std::size_t i = 0;
    for (int f = 0;; ++f) {
        while (i < line.size() && line[i] == ' ') ++i;
        const std::size_t start = i;
        while (i < line.size() && line[i] != ' ') ++i;
        if (f == n) return start < line.size() ? i : std::string::npos;
    }
}

TEST(BenchTable, AlignsCellsUnderTitles) {
    const Table t({{"shape", 0, Align::Left}, {"loom us", 8}, {"ratio", 0}});
    EXPECT_EQ(t.header(),
              "shape   loom us  ratio\n"
              "-----  --------  -----\n");
    EXPECT_EQ(t.row({"8x8", "12.5", "1.020"}), "8x8        12.5  1.020\n");
    // A wide cell pushes only its own line.
    EXPECT_EQ(t.row({"8192x8192x8192", "1.0", "0.9"}), "8192x8192x8192       1.0    0.9\n");
    EXPECT_THROW(t.row({"only one"}), loom::Error);
}

TEST(BenchTable, RenderFitsTheWidestCell) {
    const std::string s = Table::render({{"op", 0, Align::Left}, {"us", 0}}, {{"ag_gemm", "1234.5"}, {"ar", "7.0"}});
    EXPECT_EQ(s,
              "op           us\n"
              "-------  ------\n"
              "ag_gemm  1234.5\n"
              "ar          7.0\n");
    EXPECT_THROW(Table::render({{"a", 0}}, {{"1", "2"}}), loom::Error);
}

TEST(BenchTable, Cells) {
    EXPECT_EQ(cell_us(12.345), "12.3");
    EXPECT_EQ(cell_us(NAN), "-");
    EXPECT_EQ(cell_us(INFINITY), "-");
    EXPECT_EQ(cell_us(0), "-");
    EXPECT_EQ(cell_ratio(1.23456), "1.235");
    EXPECT_EQ(cell_ratio(NAN), "-");
}

TEST(BenchTable, NcclTimeAsNcclTests) {
    EXPECT_EQ(nccl_time(5.126), "   5.13");  // 2 decimals below 100 us
    EXPECT_EQ(nccl_time(99.5), "  99.50");
    EXPECT_EQ(nccl_time(123.24), "  123.2");   // 1 below 10 ms
    EXPECT_EQ(nccl_time(12345.6), "  12346");  // none above
    EXPECT_EQ(nccl_time(1234567.0), "1234567");
}

TEST(BenchTable, NcclHeaderAsNcclTests) {
    const auto h = lines(nccl_header());
    ASSERT_EQ(h.size(), 3u);
    EXPECT_EQ(h[1],
              "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw"
              "   busbw  #wrong");
    EXPECT_EQ(h[2],
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)"
              "  (GB/s)");
    EXPECT_EQ(h[0].substr(0, 1), "#");
    EXPECT_NE(h[0].find("out-of-place"), std::string::npos);
    EXPECT_GT(h[0].find("in-place"), h[0].find("out-of-place"));
}

TEST(BenchTable, NcclRowLinesUpWithTheHeader) {
    NcclRow r;
    r.bytes = 134217728;
    r.count = 33554432;
    r.type = "float";
    r.redop = "sum";
    r.out_of_place = {true, 712.5, 188.37, 329.65, 0};
    r.in_place = {true, 698.24, 192.22, 336.38, 3};
    const std::string row = nccl_row(r);
    EXPECT_EQ(row,
              "   134217728      33554432     float     sum      -1    712.5  188.37  329.65       0    698.2  192.22"
              "  336.38       3\n");
    // Every field ends where its title does (right-aligned columns), as nccl-tests' parsers expect.
    const std::string titles = lines(nccl_header())[1].substr(1);  // without the '#'
    const std::string body = row.substr(1, row.size() - 2);
    for (int f = 0; f < 13; ++f) EXPECT_EQ(field_end(titles, f), field_end(body, f)) << "field " << f;
}

TEST(BenchTable, NcclCellsNotRunOrNotChecked) {
    NcclRow r;
    r.bytes = 1024;
    r.count = 256;
    r.type = "bfloat16";
    r.redop = "none";
    r.out_of_place = {true, 8.0, 0.13, 0.11, -1};  // -c 0
    const std::string row = nccl_row(r);           // in_place did not run (all_to_all)
    EXPECT_EQ(row,
              "        1024           256  bfloat16    none      -1     8.00    0.13    0.11     N/A      N/A     N/A"
              "     N/A     N/A\n");
}

TEST(BenchTable, NcclFooter) {
    EXPECT_EQ(nccl_footer(0, 123.456), "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 123.456\n#\n");
    EXPECT_EQ(nccl_footer(7, 1.5), "# Out of bounds values : 7 FAILED\n# Avg bus bandwidth    : 1.5\n#\n");
}

}  // namespace
