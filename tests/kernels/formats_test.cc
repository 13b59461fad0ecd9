// FP4 (e2m1) and MXFP8 (e4m3) block formats: sizes and byte layout, exact
// round trips, rounding ties, scale choice, saturation, NaN/Inf, and the
// documented error bounds against float64 on fresh random inputs.
#include "strata/kernels/formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernel_test_util.h"
#include "strata/kernels/scalar_codec.h"

namespace strata::kernels {
namespace {

using namespace codec;
using testing::RandomFloats;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

std::vector<float> RoundTrip(const BlockFormat& fmt, const std::vector<float>& x) {
  const size_t rows = x.size() / fmt.values;
  std::vector<uint8_t> bytes(rows * fmt.Bytes());
  Quantize(fmt, x.data(), rows, bytes.data());
  std::vector<float> y(x.size());
  Dequantize(fmt, bytes.data(), rows, y.data());
  return y;
}

TEST(FormatsTest, EntrySizes) {
  EXPECT_EQ(kMainKv.Bytes(), 288u);
  EXPECT_EQ(kIndexerKey.Bytes(), 68u);
  EXPECT_EQ(kSwaFp8.Bytes(), 528u);
}

TEST(FormatsTest, CodecTables) {
  const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint8_t c = 0; c < 8; ++c) {
    EXPECT_EQ(DecodeE2m1(c), e2m1[c]);
    EXPECT_EQ(DecodeE2m1(c | 8), -e2m1[c]);
    EXPECT_EQ(EncodeE2m1(e2m1[c]), c);
  }
  EXPECT_EQ(DecodeE4m3(0x7e), 448.0f);
  EXPECT_EQ(DecodeE4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(DecodeE4m3(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(DecodeE4m3(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(DecodeE4m3(0x7f)));
  EXPECT_TRUE(std::isnan(DecodeE4m3(0xff)));
  for (int b = 0; b < 256; ++b) {  // every finite e4m3 value encodes to itself
    if ((b & 0x7f) == 0x7f) continue;
    const float v = DecodeE4m3(static_cast<uint8_t>(b));
    EXPECT_EQ(EncodeE4m3(v), b == 0x80 ? 0x80 : b) << b;
  }
  EXPECT_EQ(DecodeE8m0(127), 1.0f);
  EXPECT_EQ(DecodeE8m0(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(DecodeE8m0(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(DecodeE8m0(255)));
}

TEST(FormatsTest, RoundsHalfToEven) {
  EXPECT_EQ(EncodeE2m1(0.25f), 0);  // 0 | 0.5 -> 0
  EXPECT_EQ(EncodeE2m1(0.75f), 2);  // 0.5 | 1 -> 1
  EXPECT_EQ(EncodeE2m1(1.25f), 2);  // 1 | 1.5 -> 1
  EXPECT_EQ(EncodeE2m1(1.75f), 4);  // 1.5 | 2 -> 2
  EXPECT_EQ(EncodeE2m1(2.5f), 4);   // 2 | 3 -> 2
  EXPECT_EQ(EncodeE2m1(3.5f), 6);   // 3 | 4 -> 4
  EXPECT_EQ(EncodeE2m1(5.0f), 6);   // 4 | 6 -> 4
  EXPECT_EQ(EncodeE2m1(5.01f), 7);
  EXPECT_EQ(EncodeE2m1(-0.3f), 9);
  EXPECT_EQ(DecodeE4m3(EncodeE4m3(1.0625f)), 1.0f);   // 1 | 1.125 -> 1 (even)
  EXPECT_EQ(DecodeE4m3(EncodeE4m3(1.1875f)), 1.25f);  // 1.125 | 1.25 -> 1.25 (even)
  EXPECT_EQ(DecodeE4m3(EncodeE4m3(1.1876f)), 1.25f);
  EXPECT_EQ(DecodeE4m3(EncodeE4m3(std::ldexp(1.5f, -9))), std::ldexp(2.0f, -9));  // subnormal tie
  EXPECT_EQ(DecodeE4m3(EncodeE4m3(std::ldexp(0.5f, -9))), 0.0f);
  EXPECT_EQ(DecodeE4m3(EncodeE4m3(15.5f)), 16.0f);  // carries into the next binade
  EXPECT_EQ(EncodeE4m3(464.0f), 0x7e);              // saturates, never NaN
  EXPECT_EQ(EncodeE4m3(-kInf), 0xfe);
  EXPECT_EQ(EncodeE4m3(kNan), 0x7f);
}

// The codec's bit tricks against the plain definition: the nearest value
// by float64 distance, ties to the even code, beyond the top saturating.
uint8_t NearestCode(double v, int codes, float (*decode)(uint8_t)) {
  int best = 0;
  for (int c = 1; c < codes; ++c) {
    const double dc = std::fabs(std::fabs(v) - decode(static_cast<uint8_t>(c)));
    const double db = std::fabs(std::fabs(v) - decode(static_cast<uint8_t>(best)));
    if (dc < db || (dc == db && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(best);
}

TEST(FormatsTest, EncodersMatchTheDefinition) {
  std::vector<float> probes;
  for (int c = 0; c < 127; ++c) {  // every value, midpoint, and its float neighbours
    const float v = DecodeE4m3(static_cast<uint8_t>(c)),
                w = DecodeE4m3(static_cast<uint8_t>(c + 1));
    const float mid = c + 1 < 127 ? (v + w) / 2 : 460.0f;
    for (float p : {v, mid}) {
      probes.push_back(p);
      probes.push_back(std::nextafter(p, 0.0f));
      probes.push_back(std::nextafter(p, 1e9f));
    }
  }
  const std::vector<float> r = RandomFloats(20000, 99);
  for (size_t i = 0; i < r.size(); ++i)
    probes.push_back(std::ldexp(r[i], static_cast<int>(i % 28) - 18));
  for (float p : probes) {
    for (float v : {p, -p}) {
      const uint8_t sign = std::signbit(v) ? 0x80 : 0;
      ASSERT_EQ(EncodeE4m3(v), sign | NearestCode(v, 127, DecodeE4m3)) << v;
      ASSERT_EQ(EncodeE2m1(v * 0.0625f), (sign >> 4) | NearestCode(v * 0.0625, 8, DecodeE2m1)) << v;
    }
  }
}

TEST(FormatsTest, ScaleIsSmallestPowerOfTwoThatDoesNotClip) {
  EXPECT_EQ(ScaleForAmax(6.0f, kE2m1Max), 127);
  EXPECT_EQ(ScaleForAmax(6.001f, kE2m1Max), 128);
  EXPECT_EQ(ScaleForAmax(3.0f, kE2m1Max), 126);
  EXPECT_EQ(ScaleForAmax(3.001f, kE2m1Max), 127);
  EXPECT_EQ(ScaleForAmax(448.0f, kE4m3Max), 127);
  EXPECT_EQ(ScaleForAmax(449.0f, kE4m3Max), 128);
  EXPECT_EQ(ScaleForAmax(1.0f, kE4m3Max), 127 - 8);
  EXPECT_EQ(ScaleForAmax(0.0f, kE4m3Max), 127);
  EXPECT_EQ(ScaleForAmax(std::numeric_limits<float>::max(), kE2m1Max), 127 + 126);
  EXPECT_EQ(ScaleForAmax(std::numeric_limits<float>::denorm_min(), kE2m1Max), 0);  // clamped
}

TEST(FormatsTest, ByteLayoutValuesFirstThenScales) {
  std::vector<float> x(kMainKv.values, 0.0f);
  x[0] = 1.0f;  // group 0: amax 6 -> scale 2^0
  x[1] = -6.0f;
  x[16] = 12.0f;  // group 1: amax 12 -> scale 2^1, 12 -> code 7
  std::vector<uint8_t> b(kMainKv.Bytes());
  Quantize(kMainKv, x.data(), 1, b.data());
  EXPECT_EQ(b[0], 0xf2);  // value 0 (code 2) low nibble, value 1 (code 15) high nibble
  EXPECT_EQ(b[8], 0x07);
  EXPECT_EQ(b[256], 127);
  EXPECT_EQ(b[257], 128);
  EXPECT_EQ(b[258], 127);  // all-zero group

  std::vector<float> y(kSwaFp8.values, 0.0f);
  y[31] = 448.0f;
  y[32] = 1.0f;
  std::vector<uint8_t> c(kSwaFp8.Bytes());
  Quantize(kSwaFp8, y.data(), 1, c.data());
  EXPECT_EQ(c[31], 0x7e);
  EXPECT_EQ(c[32], 0x78);  // group 1: scale 2^-8, so 1.0 is stored as 2^8
  EXPECT_EQ(c[512], 127);
  EXPECT_EQ(c[513], 127 - 8);
}

// Every value of the form code * 2^k survives a round trip unchanged when
// the group's largest value pins the scale to 2^k.
TEST(FormatsTest, ExactValuesRoundTrip) {
  for (int k : {-127, -20, 0, 7, 100}) {
    std::vector<float> x(kMainKv.values);
    for (uint32_t i = 0; i < x.size(); ++i) {
      x[i] = std::ldexp(DecodeE2m1(static_cast<uint8_t>(i % 16)), k);
      if (i % 16 == 0) x[i] = std::ldexp(6.0f, k);  // pins the scale
    }
    EXPECT_EQ(RoundTrip(kMainKv, x), x) << k;
    std::vector<float> w(kIndexerKey.values);
    for (uint32_t i = 0; i < w.size(); ++i) w[i] = x[i % 16];
    EXPECT_EQ(RoundTrip(kIndexerKey, w), w) << k;
  }
  for (int k : {-120, -3, 0, 12, 100}) {
    std::vector<float> x(kSwaFp8.values);
    for (uint32_t i = 0; i < x.size(); ++i) {
      uint8_t b = static_cast<uint8_t>((i * 7) % 256);
      if ((b & 0x7f) == 0x7f) b = 0x7e;
      x[i] = std::ldexp(DecodeE4m3(b), k);
      if (i % 32 == 0) x[i] = std::ldexp(448.0f, k);
    }
    EXPECT_EQ(RoundTrip(kSwaFp8, x), x) << k;
  }
}

// Documented bounds, per value, against float64, over groups whose
// magnitudes span many binades.
TEST(FormatsTest, ErrorBoundsOnRandomInputs) {
  for (const BlockFormat& fmt : {kMainKv, kIndexerKey, kSwaFp8}) {
    const size_t rows = 64;
    std::vector<float> x = RandomFloats(rows * fmt.values, 1 + fmt.values + fmt.group);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = std::ldexp(x[i], static_cast<int>(i / fmt.group % 40) - 20);
    std::vector<uint8_t> bytes(rows * fmt.Bytes());
    Quantize(fmt, x.data(), rows, bytes.data());
    std::vector<float> y(x.size());
    Dequantize(fmt, bytes.data(), rows, y.data());
    const bool fp4 = fmt.element == Element::kE2m1;
    for (size_t r = 0; r < rows; ++r) {
      for (uint32_t g = 0; g < fmt.values / fmt.group; ++g) {
        const double s = DecodeE8m0(bytes[r * fmt.Bytes() + fmt.CodeBytes() + g]);
        double amax = 0;
        for (uint32_t i = 0; i < fmt.group; ++i)
          amax = std::max(amax, std::fabs(double{x[r * fmt.values + g * fmt.group + i]}));
        // The scale is the smallest power of two that does not clip.
        const double fmax = fp4 ? 6.0 : 448.0;
        ASSERT_LE(amax, fmax * s);
        ASSERT_GT(amax, fmax * s / 2);
        for (uint32_t i = 0; i < fmt.group; ++i) {
          const size_t v = r * fmt.values + g * fmt.group + i;
          const double err = std::fabs(double{x[v]} - double{y[v]});
          const double bound = fp4 ? std::max(std::fabs(double{x[v]}) / 4, s / 4)
                                   : std::max(std::fabs(double{x[v]}) / 16, s / 1024);
          ASSERT_LE(err, bound) << "value " << x[v] << " -> " << y[v];
        }
      }
    }
  }
}

TEST(FormatsTest, InfSaturatesAndNanIsNeverANumber) {
  std::vector<float> x(kMainKv.values, 1.0f);
  x[3] = kInf;
  x[4] = -kInf;
  x[20] = kNan;  // group 1
  std::vector<float> y = RoundTrip(kMainKv, x);
  // The scale comes from the finite values (amax 1 -> 2^-2); Inf saturates
  // to 6 * 2^-2.
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[3], 1.5f);
  EXPECT_EQ(y[4], -1.5f);
  for (int i = 16; i < 32; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;  // the whole group
  EXPECT_EQ(y[32], 1.0f);

  std::vector<float> z(kSwaFp8.values, 2.0f);
  z[1] = kInf;
  z[2] = kNan;
  std::vector<float> w = RoundTrip(kSwaFp8, z);
  EXPECT_EQ(w[0], 2.0f);
  EXPECT_EQ(w[1], 3.5f);  // amax 2 -> scale 2^-7; Inf -> 448 * 2^-7
  EXPECT_TRUE(std::isnan(w[2]));
  EXPECT_EQ(w[3], 2.0f);
}

// Every NaN dequantizes to the same bits (what lets CUDA match the CPU
// bit for bit), whatever the NaN's sign or payload.
TEST(FormatsTest, EveryNanDequantizesToTheCanonicalNan) {
  auto bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
  };
  for (const BlockFormat& fmt : {kMainKv, kIndexerKey, kSwaFp8}) {
    std::vector<float> x(fmt.values, -0.75f);
    x[1] = -kNan;
    x[fmt.group + 2] = kNan;
    const std::vector<float> y = RoundTrip(fmt, x);
    const bool fp4 = fmt.element == Element::kE2m1;
    for (uint32_t i = 0; i < 2 * fmt.group; ++i) {
      const bool nan = fp4 || i == 1 || i == fmt.group + 2;
      if (nan) {
        EXPECT_EQ(bits(y[i]), 0x7fc00000u) << i;
      } else {
        EXPECT_EQ(y[i], -0.75f) << i;
      }
    }
    EXPECT_EQ(y[2 * fmt.group], -0.75f);
  }
  // e4m3 keeps a NaN's sign in its code (whatever scaling does to NaNs).
  std::vector<float> x(kSwaFp8.values, 1.0f);
  x[1] = -kNan;
  x[2] = kNan;
  std::vector<uint8_t> q(kSwaFp8.Bytes());
  Quantize(kSwaFp8, x.data(), 1, q.data());
  EXPECT_EQ(q[1], 0xff);
  EXPECT_EQ(q[2], 0x7f);
}

TEST(FormatsTest, RowsAreIndependent) {
  const std::vector<float> x = RandomFloats(8 * kSwaFp8.values, 7);
  std::vector<uint8_t> all(8 * kSwaFp8.Bytes()), one(kSwaFp8.Bytes());
  Quantize(kSwaFp8, x.data(), 8, all.data());
  for (size_t r = 0; r < 8; ++r) {
    Quantize(kSwaFp8, x.data() + r * kSwaFp8.values, 1, one.data());
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + r * kSwaFp8.Bytes()));
  }
}

}  // namespace
}  // namespace strata::kernels
