#include "nccl_args.hpp"

#include <algorithm>
#include <cctype>
#include <utility>

#include "loom/runtime/env.hpp"
#include "loom/runtime/error.hpp"

namespace loom::bench {
namespace {

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

// Every type Loom's collectives take, in nccl-tests' order.
constexpr DType kTypes[] = {DType::U8, DType::I32, DType::I64, DType::F16, DType::F32, DType::BF16, DType::F8E4M3};

// A parse error from a loom::Error raised while converting an option's value.
template <typename F>
auto as_validation(F&& f) {
    try {
        return f();
    } catch (const loom::Error& e) {
        throw CLI::ValidationError(e.detail());  // the message names the flag
    }
}

}  // namespace

std::size_t parse_size(const std::string& text, const std::string& flag) {
    const std::size_t n = loom::parse_bytes(text, flag);
    LOOM_CHECK(n > 0, "{}: expected a size of at least 1 byte (8, 1K, 128M, 1G), given \"{}\"", flag, text);
    return n;
}

std::vector<std::size_t> size_series(std::size_t min_bytes, std::size_t max_bytes, int factor) {
    LOOM_CHECK(min_bytes >= 1 && min_bytes <= max_bytes,
               "expected 1 <= -b (min bytes) <= -e (max bytes), given -b {} and -e {}", min_bytes, max_bytes);
    LOOM_CHECK(factor >= 2 || min_bytes == max_bytes,
               "-f (step factor): expected an integer >= 2 (or -b equal to -e), given {}", factor);
    std::vector<std::size_t> sizes;
    for (std::size_t s = min_bytes; s <= max_bytes; s *= static_cast<std::size_t>(factor)) {
        sizes.push_back(s);
        if (min_bytes == max_bytes || s > max_bytes / static_cast<std::size_t>(factor)) break;
    }
    return sizes;
}

DType parse_dtype(const std::string& name) {
    static const std::pair<const char*, DType> kNames[] = {
        {"float", DType::F32},     {"float32", DType::F32}, {"f32", DType::F32},       {"fp32", DType::F32},
        {"half", DType::F16},      {"float16", DType::F16}, {"f16", DType::F16},       {"fp16", DType::F16},
        {"bfloat16", DType::BF16}, {"bf16", DType::BF16},   {"f8e4m3", DType::F8E4M3}, {"fp8_e4m3", DType::F8E4M3},
        {"int32", DType::I32},     {"int", DType::I32},     {"int64", DType::I64},     {"uint8", DType::U8},
        {"u8", DType::U8},         {"char", DType::U8}};
    const std::string n = lower(name);
    for (const auto& [k, t] : kNames)
        if (n == k) return t;
    for (const char* missing : {"double", "float64", "int8", "uint32", "uint64", "f8e5m2"})
        LOOM_CHECK(n != missing,
                   "-d (datatype): {} is an nccl-tests type Loom's collectives do not take; expected float, half, "
                   "bfloat16, f8e4m3, int32, int64 or uint8",
                   name);
    LOOM_FAIL("-d (datatype): expected float, half, bfloat16, f8e4m3, int32, int64, uint8 or all, given \"{}\"", name);
}

const char* nccl_type_name(DType t) {
    switch (t) {
        case DType::F32:
            return "float";
        case DType::F16:
            return "half";
        case DType::BF16:
            return "bfloat16";
        case DType::F8E4M3:
            return "f8e4m3";
        case DType::I32:
            return "int32";
        case DType::I64:
            return "int64";
        case DType::U8:
            return "uint8";
    }
    return "?";
}

bool reducible(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

ReduceOp parse_redop(const std::string& name) {
    const std::string n = lower(name);
    if (n == "sum") return ReduceOp::Sum;
    if (n == "max") return ReduceOp::Max;
    for (const char* missing : {"prod", "min", "avg", "mulsum"})
        LOOM_CHECK(n != missing, "-o (op): Loom's collectives reduce with sum or max only, given \"{}\"", name);
    LOOM_FAIL("-o (op): expected sum, max or all, given \"{}\"", name);
}

const char* nccl_op_name(ReduceOp op) { return op == ReduceOp::Max ? "max" : "sum"; }

CollKind parse_coll(const std::string& name) {
    std::string n = lower(name);
    if (n.size() > 5 && n.compare(n.size() - 5, 5, "_perf") == 0) n.resize(n.size() - 5);  // all_reduce_perf
    n.erase(std::remove(n.begin(), n.end(), '_'), n.end());
    if (n == "allgather") return CollKind::AllGather;
    if (n == "reducescatter") return CollKind::ReduceScatter;
    if (n == "allreduce") return CollKind::AllReduce;
    if (n == "alltoall") return CollKind::AllToAll;
    LOOM_FAIL("collective: expected all_gather, reduce_scatter, all_reduce or all_to_all, given \"{}\"", name);
}

bool is_reduction(CollKind k) { return k == CollKind::ReduceScatter || k == CollKind::AllReduce; }

double bus_factor(CollKind k, int ranks) {
    LOOM_CHECK(ranks >= 1, "bus_factor: expected at least 1 rank, given {}", ranks);
    const double n = ranks;
    switch (k) {
        case CollKind::AllReduce:
            return 2.0 * (n - 1) / n;
        case CollKind::AllGather:
        case CollKind::ReduceScatter:
        case CollKind::AllToAll:
        case CollKind::AllToAllV:
            return (n - 1) / n;
    }
    return 1.0;
}

CollSize coll_size(CollKind k, std::size_t bytes, DType t, int ranks) {
    LOOM_CHECK(ranks >= 1, "coll_size: expected at least 1 rank, given {}", ranks);
    const std::size_t es = static_cast<std::size_t>(dtype_size(t)), W = static_cast<std::size_t>(ranks);
    CollSize s;
    if (k == CollKind::AllReduce) {
        s.count = s.chunk = s.in_count = s.out_count = bytes / es;
    } else {
        s.chunk = bytes / es / W;
        s.count = s.chunk * W;
        s.in_count = k == CollKind::AllGather ? s.chunk : s.count;
        s.out_count = k == CollKind::ReduceScatter ? s.chunk : s.count;
    }
    s.bytes = s.count * es;
    return s;
}

void add_nccl_options(CLI::App& app, NcclArgs& a) {
    auto size_option = [&](const std::string& names, const std::string& flag, std::size_t& target,
                           const std::string& help) {
        app.add_option_function<std::string>(
            names,
            [&target, flag](const std::string& text) {
                target = as_validation([&] { return parse_size(text, flag); });
            },
            help);
    };
    size_option("-b,--minbytes,--min-bytes", "-b", a.min_bytes,
                "smallest size in bytes: 8, 1K, 128M, 1G (table default 8; JSON sweep default 1K)");
    size_option("-e,--maxbytes,--max-bytes", "-e", a.max_bytes,
                "largest size in bytes (table default 128M; JSON sweep default 1G)");
    app.add_option("-f,--stepfactor", a.step_factor, "size multiplier between rows (table default 2; JSON sweep 4)")
        ->check(CLI::PositiveNumber);
    app.add_option("-d,--datatype", a.dtypes,
                   "float, half, bfloat16 (reductions); also f8e4m3, int32, int64, uint8 (all_gather, all_to_all); "
                   "all; comma-separated")
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("-o,--op", a.redops, "reduction: sum, max or all; comma-separated")
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("-n", a.iters, "calls timed back to back per timed run (the table's time is per call)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("-w,--warmup_iters", a.warmup, "untimed calls before timing")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("-c,--check", a.check, "1: check every element of every rank's result (#wrong); 0: no check")
        ->capture_default_str()
        ->check(CLI::Range(0, 1));
    app.add_option("--runs", a.runs, "timed runs of -n calls per size; the table shows the median")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--seed", a.seed, "seed of the random inputs (0: from the clock; printed in the header)");
}

std::vector<TypeOp> type_ops(CollKind k, const NcclArgs& a) {
    const bool reduce = is_reduction(k);
    std::vector<DType> types;
    for (const std::string& d : a.dtypes) {
        if (lower(d) == "all") {
            for (DType t : kTypes)
                if (!reduce || reducible(t)) types.push_back(t);
            continue;
        }
        const DType t = parse_dtype(d);
        LOOM_CHECK(!reduce || reducible(t), "-d (datatype): {} reduces float, half or bfloat16 only, given \"{}\"",
                   to_string(k), d);
        types.push_back(t);
    }
    std::vector<ReduceOp> ops;
    for (const std::string& o : a.redops) {
        if (lower(o) == "all") {
            ops.insert(ops.end(), {ReduceOp::Sum, ReduceOp::Max});
        } else {
            ops.push_back(parse_redop(o));
        }
    }
    std::vector<TypeOp> out;
    for (DType t : types) {
        if (!reduce) {
            out.push_back({t, ReduceOp::Sum, "none"});
            continue;
        }
        for (ReduceOp op : ops) out.push_back({t, op, nccl_op_name(op)});
    }
    return out;
}

}  // namespace loom::bench
