#include "table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "loom/runtime/error.hpp"

namespace loom::bench {
namespace {

std::string pad(const std::string& s, int width, Align a) {
    const std::size_t w = static_cast<std::size_t>(std::max(width, 0));
    if (s.size() >= w) return s;
    return a == Align::Left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}

// Joins padded cells with two spaces; trailing blanks are dropped.
std::string line(const std::vector<Column>& cols, const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t i = 0; i < cols.size(); ++i) {
        if (i) out += "  ";
        out += pad(cells[i], cols[i].width, cols[i].align);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
}

std::string cell(const NcclCell& c) {
    if (!c.ran) return fmt::format("  {:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A");
    const std::string wrong = c.wrong < 0 ? "N/A" : std::to_string(c.wrong);
    return fmt::format("  {}  {:6.2f}  {:6.2f}  {:>6}", nccl_time(c.us), c.algbw, c.busbw, wrong);
}

}  // namespace

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {
    for (Column& c : columns_) c.width = std::max(c.width, static_cast<int>(c.title.size()));
}

std::string Table::header() const {
    std::vector<std::string> titles, rules;
    for (const Column& c : columns_) {
        titles.push_back(c.title);
        rules.push_back(std::string(static_cast<std::size_t>(c.width), '-'));
    }
    return line(columns_, titles) + line(columns_, rules);
}

std::string Table::row(const std::vector<std::string>& cells) const {
    LOOM_CHECK(cells.size() == columns_.size(), "Table::row: expected {} cells (one per column), given {}",
               columns_.size(), cells.size());
    return line(columns_, cells);
}

std::string Table::render(std::vector<Column> columns, const std::vector<std::vector<std::string>>& rows) {
    for (const auto& r : rows) {
        LOOM_CHECK(r.size() == columns.size(), "Table::render: expected {} cells per row, given {}", columns.size(),
                   r.size());
        for (std::size_t i = 0; i < r.size(); ++i)
            columns[i].width = std::max(columns[i].width, static_cast<int>(r[i].size()));
    }
    const Table t(std::move(columns));
    std::string out = t.header();
    for (const auto& r : rows) out += t.row(r);
    return out;
}

std::string cell_us(double us) { return std::isfinite(us) && us > 0 ? fmt::format("{:.1f}", us) : "-"; }
std::string cell_ratio(double r) { return std::isfinite(r) && r > 0 ? fmt::format("{:.3f}", r) : "-"; }

std::string nccl_time(double us) {
    if (us >= 10000.0) return fmt::format("{:7.0f}", us);
    if (us >= 100.0) return fmt::format("{:7.1f}", us);
    return fmt::format("{:7.2f}", us);
}

std::string nccl_header() {
    // Each half (time, algbw, busbw, #wrong) is 33 characters wide with its leading blanks.
    std::string s = fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}{:^33}{:^33}", "", "", "", "", "", "out-of-place",
                                "in-place");
    while (s.back() == ' ') s.pop_back();
    s += "\n";
    s += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}", "size", "count", "type", "redop", "root");
    s += fmt::format("  {:>7}  {:>6}  {:>6}  {:>6}", "time", "algbw", "busbw", "#wrong");
    s += fmt::format("  {:>7}  {:>6}  {:>6}  {:>6}\n", "time", "algbw", "busbw", "#wrong");
    s += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}", "(B)", "(elements)", "", "", "");
    s += fmt::format("  {:>7}  {:>6}  {:>6}  {:>6}", "(us)", "(GB/s)", "(GB/s)", "");
    s += fmt::format("  {:>7}  {:>6}  {:>6}  {:>6}", "(us)", "(GB/s)", "(GB/s)", "");
    while (s.back() == ' ') s.pop_back();
    return s + "\n";
}

std::string nccl_row(const NcclRow& r) {
    return fmt::format("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}", r.bytes, r.count, r.type, r.redop, r.root) +
           cell(r.out_of_place) + cell(r.in_place) + "\n";
}

std::string nccl_footer(long long wrong, double avg_busbw) {
    return fmt::format("# Out of bounds values : {} {}\n# Avg bus bandwidth    : {:g}\n#\n", wrong,
                       wrong == 0 ? "OK" : "FAILED", avg_busbw);
}

}  // namespace loom::bench
