// Helpers for the kernel tests: seeded random inputs and float64 references.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "strata/kernels/formats.h"

namespace strata::kernels::testing {

// Inputs are fresh every run: the base seed comes from std::random_device
// unless STRATA_TEST_SEED is set, and is printed so a failure can be
// repeated. Tests add their own offset to it.
inline uint64_t TestSeed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("STRATA_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::fprintf(stderr, "kernel tests: seed %llu (STRATA_TEST_SEED=%llu repeats it)\n",
                 static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(TestSeed() * 1000003 + seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline double Dot64(const float* a, const float* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double{a[i]} * double{b[i]};
  return s;
}

// rows random entries quantized to fmt, and their exact dequantized values.
struct QuantizedRows {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
inline QuantizedRows RandomQuantized(const BlockFormat& fmt, size_t rows, uint64_t seed) {
  QuantizedRows q;
  const std::vector<float> x = RandomFloats(rows * fmt.values, seed);
  q.bytes.resize(rows * fmt.Bytes());
  q.values.resize(rows * fmt.values);
  Quantize(fmt, x.data(), rows, q.bytes.data());
  Dequantize(fmt, q.bytes.data(), rows, q.values.data());
  return q;
}

}  // namespace strata::kernels::testing
