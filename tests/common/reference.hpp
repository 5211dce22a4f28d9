// Host-side references and comparisons for tests and benchmarks.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "loom/bf16.hpp"
#include "loom/tensor.hpp"

namespace loom::test {

// bf16 / fp16 <-> float on the host (round to nearest even). The bf16 pair is the public one (loom/bf16.hpp).
using loom::bf16_to_float;
using loom::float_to_bf16;
std::uint16_t float_to_half(float f);
float half_to_float(std::uint16_t h);

// A test's seed for this run: `seed` mixed with LOOM_TEST_SEED (read once; unset or 0: `seed` itself, the fixed
// inputs). tests/run_gpu_tests.sh draws a fresh LOOM_TEST_SEED per run and prints it; loomrun passes it to every rank,
// so ranks that regenerate each other's inputs still agree. Every random input of the GPU tests goes through it.
std::uint64_t run_seed(std::uint64_t seed);

// Random values in [-1, 1) from run_seed(seed).
std::vector<float> random_floats(std::size_t n, std::uint64_t seed);

// DeepGEMM's similarity metric: 1 - 2<x,y>/(<x,x>+<y,y>), computed in double. ~0 when equal.
double calc_diff(std::span<const double> ref, std::span<const double> got);
// ||got - ref|| / ||ref|| in double.
double rel_l2(std::span<const double> ref, std::span<const double> got);

// Element i of raw values of `t` (f32, bf16 or f16) as a double.
double value_at(DType t, std::span<const char> raw, std::size_t i);
// Tolerance of one element of a W-way sum accumulated in fp32 and rounded once to `t` (f32, bf16 or f16).
double sum_tolerance(DType t, double ref, int W);

}  // namespace loom::test
