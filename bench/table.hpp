// The benchmarks' text tables: an aligned table (bench-gemm, bench-overlap) and nccl-tests' table
// (bench-collectives). Host only: formatting, no GPU, so CPU unit tests check the exact text.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace loom::bench {

enum class Align { Left, Right };

struct Column {
    std::string title;
    int width = 0;  // at least this wide (and at least the title)
    Align align = Align::Right;
};

// Columns separated by two spaces, each cell padded to its column's width; a cell wider than its column pushes the
// rest of its own line right (the other lines keep their places). Rows are printed as they come (long benchmarks
// show progress), so the widths are fixed up front; render() fits them to the cells of a finished table instead.
class Table {
  public:
    explicit Table(std::vector<Column> columns);
    // The titles, then a rule of dashes under each title.
    std::string header() const;
    // One line; raises loom::Error unless there is one cell per column.
    std::string row(const std::vector<std::string>& cells) const;
    std::size_t columns() const { return columns_.size(); }
    // A whole table: header and rows, each column as wide as its widest cell.
    static std::string render(std::vector<Column> columns, const std::vector<std::vector<std::string>>& rows);

  private:
    std::vector<Column> columns_;
};

// Cells: microseconds to one decimal ("123.4"), a ratio to three ("1.234"); "-" for NaN, infinity or <= 0.
std::string cell_us(double us);
std::string cell_ratio(double r);

// ---- nccl-tests' table -----------------------------------------------------------------------------------------
// One half of a row (out-of-place or in-place).
struct NcclCell {
    bool ran = false;      // false: "N/A" in every column (e.g. all_to_all has no in-place form)
    double us = 0;         // per call
    double algbw = 0;      // GB/s
    double busbw = 0;      // GB/s
    long long wrong = -1;  // elements wrong over every rank; -1: not checked (-c 0), printed "N/A"
};
struct NcclRow {
    std::size_t bytes = 0, count = 0;
    std::string type, redop;  // "float", "sum" / "none"
    int root = -1;            // -1: no root (every collective here)
    NcclCell out_of_place, in_place;
};

// The column titles, as nccl-tests prints them (three lines, each starting with '#').
std::string nccl_header();
std::string nccl_row(const NcclRow& r);
// nccl-tests' time cell: 7 wide, 2 decimals below 100 us, 1 below 10 ms, none above.
std::string nccl_time(double us);
// "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth    : X" (the mean busbw over every cell that ran).
std::string nccl_footer(long long wrong, double avg_busbw);

}  // namespace loom::bench
