// Shuffles and quad/warp reductions against scalar references, half/bf16 packing, and the
// f16/bf16 conversions: every bit pattern round-trips, and rounding is to nearest even at every
// midpoint (subnormals and the overflow threshold included).
#include "test_util.h"

#include <cstring>
#include <vector>

using cleave::bf16;
using cleave::half;
using cleave::emu::detail::bits_f32;
using cleave::emu::detail::f32_bits;

namespace {

constexpr int kWarps = 2;

void shuffles(uint64_t seed) {
  test::Rng rng(seed);
  constexpr int n = 32 * kWarps;
  std::vector<float> v(n);
  std::vector<int> src(n);
  // Magnitudes spread over 2^-10..2^10, so that sums round and a different reduction order
  // would give different bits.
  for (float& x : v) x = std::ldexp(rng.uniform(), int(rng.next() % 21) - 10);
  for (int& s : src) s = int(rng.next() % 100);  // beyond 31 too: only the low 5 bits count
  std::vector<float> xf(n * 32), idx(n), qmax(n), qsum(n), wmax(n), wsum(n);
  std::vector<unsigned> xu(n * 32);
  std::vector<int> xi(n), ii(n);
  int rc = test::run(test::config(1, n), [&] {
    unsigned t = threadIdx.x;
    for (int m = 0; m < 32; ++m) {
      xf[t * 32 + m] = __shfl_xor_sync(0xffffffffu, v[t], m);
      xu[t * 32 + m] = __shfl_xor_sync(0xffffffffu, f32_bits(v[t]), m);
    }
    xi[t] = __shfl_xor_sync(0xffffffffu, int(t) * 3 - 50, 7);
    idx[t] = __shfl_sync(0xffffffffu, v[t], src[t]);
    ii[t] = __shfl_sync(0xffffffffu, -int(t), src[t]);
    qmax[t] = cleave::quad_max(v[t]);
    qsum[t] = cleave::quad_sum(v[t]);
    wmax[t] = cleave::warp_max(v[t]);
    wsum[t] = cleave::warp_sum(v[t]);
  });
  CHECK(rc == 0, "shuffles: launch failed");
  for (int t = 0; t < n; ++t) {
    int base = t & ~31, lane = t & 31;
    for (int m = 0; m < 32; ++m) {
      float want = v[base + (lane ^ m)];
      CHECK(xf[t * 32 + m] == want, "shfl_xor float t %d mask %d", t, m);
      CHECK(xu[t * 32 + m] == f32_bits(want), "shfl_xor uint t %d mask %d", t, m);
    }
    CHECK(xi[t] == (base + (lane ^ 7)) * 3 - 50, "shfl_xor int t %d", t);
    CHECK(idx[t] == v[base + (src[t] & 31)], "shfl idx t %d src %d", t, src[t]);
    CHECK(ii[t] == -(base + (src[t] & 31)), "shfl idx int t %d", t);
    // The device butterflies: quad (1, 2) and warp (16, 8, 4, 2, 1), own value first.
    float q0 = v[base + (lane & ~3)], q1 = v[base + (lane & ~3) + 1];
    float q2 = v[base + (lane & ~3) + 2], q3 = v[base + (lane & ~3) + 3];
    CHECK(qsum[t] == (q0 + q1) + (q2 + q3), "quad_sum t %d", t);
    CHECK(qmax[t] == fmaxf(fmaxf(q0, q1), fmaxf(q2, q3)), "quad_max t %d", t);
    float s[32], mx[32];
    for (int l = 0; l < 32; ++l) s[l] = mx[l] = v[base + l];
    for (int step = 16; step > 0; step /= 2) {
      float ns[32], nm[32];
      for (int l = 0; l < 32; ++l) {
        ns[l] = s[l] + s[l ^ step];
        nm[l] = fmaxf(mx[l], mx[l ^ step]);
      }
      std::memcpy(s, ns, sizeof s);
      std::memcpy(mx, nm, sizeof mx);
    }
    CHECK(wsum[t] == s[lane], "warp_sum t %d: got %.9g want %.9g", t, wsum[t], s[lane]);
    CHECK(wmax[t] == mx[lane], "warp_max t %d", t);
    double exact = 0;
    float top = -INFINITY;
    for (int l = 0; l < 32; ++l) {
      exact += v[base + l];
      top = fmaxf(top, v[base + l]);
    }
    CHECK(std::fabs(wsum[t] - exact) <= 1e-5 * 32 * 1024, "warp_sum t %d vs exact", t);
    CHECK(wmax[t] == top, "warp_max t %d vs scalar max", t);
  }
}

// Packing puts lo in the low 16 bits and rounds like from_float; unpacking widens exactly.
void packing(uint64_t seed) {
  test::Rng rng(seed);
  for (int i = 0; i < 20000; ++i) {
    float lo = 100.0f * rng.uniform(), hi = bits_f32(uint32_t(rng.next()));
    uint32_t h = cleave::pack_half2(lo, hi);
    CHECK(uint16_t(h) == cleave::from_float<half>(lo).bits &&
              uint16_t(h >> 16) == cleave::from_float<half>(hi).bits,
          "pack_half2(%g, %g) = %08x", lo, hi, h);
    float2 u = cleave::unpack_half2(h);
    CHECK(f32_bits(u.x) == f32_bits(cleave::to_float(half{uint16_t(h)})) &&
              f32_bits(u.y) == f32_bits(cleave::to_float(half{uint16_t(h >> 16)})),
          "unpack_half2(%08x)", h);
    CHECK(cleave::pack_half2(u.x, u.y) == h, "half2 round trip %08x", h);
    uint32_t b = cleave::pack_bf162(lo, hi);
    CHECK(uint16_t(b) == cleave::from_float<bf16>(lo).bits &&
              uint16_t(b >> 16) == cleave::from_float<bf16>(hi).bits,
          "pack_bf162(%g, %g) = %08x", lo, hi, b);
    float2 w = cleave::unpack_bf162(b);
    CHECK(f32_bits(w.x) == uint32_t(b << 16) && f32_bits(w.y) == (b & 0xffff0000u),
          "unpack_bf162(%08x)", b);
    CHECK(cleave::pack_bf162(w.x, w.y) == b, "bf162 round trip %08x", b);
  }
  CHECK(cleave::pack_half2(1.0f, -2.0f) == 0xc0003c00u, "pack_half2(1, -2)");
  CHECK(cleave::pack_bf162(1.0f, -2.0f) == 0xc0003f80u, "pack_bf162(1, -2)");
}

void round_trips() {
  for (uint32_t i = 0; i < 65536; ++i) {
    uint16_t b = uint16_t(i);
    CHECK(cleave::from_float<half>(cleave::to_float(half{b})).bits == b, "f16 %04x round trip", i);
    CHECK(cleave::from_float<bf16>(cleave::to_float(bf16{b})).bits == b, "bf16 %04x round trip",
          i);
    float h = cleave::to_float(half{b});
    bool nan = (b & 0x7c00) == 0x7c00 && (b & 0x3ff);
    CHECK(std::isnan(h) == nan, "f16 %04x NaN-ness", i);
  }
  CHECK(cleave::to_float(half{0x0001}) == 5.9604644775390625e-8f, "smallest f16 subnormal");
  CHECK(cleave::to_float(half{0x7bff}) == 65504.0f, "largest f16");
  CHECK(cleave::from_float<half>(std::nanf("")).bits == 0x7e00, "f16 quiet NaN");
  CHECK(cleave::from_float<bf16>(std::nanf("")).bits == 0x7fc0, "bf16 quiet NaN");
  CHECK(std::isnan(cleave::to_float(cleave::from_float<bf16>(bits_f32(0x7f800001u)))),
        "bf16 keeps a NaN whose payload lies in the dropped bits");
}

// Between every pair of adjacent non-negative values a and b (b = a + one unit, including the
// step from the largest finite value to infinity), the exact midpoint rounds to whichever has
// an even encoding, and the floats just below and above it round down and up.
template <class T>
void midpoints(const char* name, uint16_t last_finite) {
  for (uint32_t a = 0; a <= last_finite; ++a) {
    uint32_t b = a + 1;
    double lo = cleave::to_float(T{uint16_t(a)});
    // Past the largest finite value, the next step is where the next binade would start.
    double hi = b == uint32_t(last_finite) + 1
                    ? 2 * lo - double(cleave::to_float(T{uint16_t(a - 1)}))
                    : double(cleave::to_float(T{uint16_t(b)}));
    float mid = float((lo + hi) / 2);
    CHECK(double(mid) == (lo + hi) / 2, "%s: midpoint of %04x not exact", name, a);
    uint16_t even = (a & 1) ? uint16_t(b) : uint16_t(a);
    for (float sign : {1.0f, -1.0f}) {
      uint16_t s = sign < 0 ? 0x8000 : 0;
      float m = sign * mid;
      CHECK(cleave::from_float<T>(m).bits == (even | s), "%s: midpoint after %04x (sign %g)", name,
            a, sign);
      CHECK(cleave::from_float<T>(std::nextafterf(m, 0.0f)).bits == (a | s),
            "%s: just below the midpoint after %04x", name, a);
      CHECK(cleave::from_float<T>(std::nextafterf(m, sign * INFINITY)).bits == (b | s),
            "%s: just above the midpoint after %04x", name, a);
    }
  }
  CHECK(cleave::from_float<T>(INFINITY).bits == last_finite + 1, "%s: +inf", name);
  CHECK(cleave::from_float<T>(bits_f32(0x7f7fffffu)).bits == last_finite + 1, "%s: FLT_MAX", name);
}

// Cross-check the f16 conversion against the compiler's own _Float16 where C++ has one (Clang,
// and GCC on x86-64).
void against_compiler(uint64_t seed) {
#if defined(__FLT16_MAX__) && (defined(__clang__) || defined(__x86_64__))
  test::Rng rng(seed);
  for (int i = 0; i < 1000000; ++i) {
    // Concentrate on the f16 range: exponents around 2^-30 .. 2^17, any mantissa.
    uint32_t bits = uint32_t(rng.next());
    if (i & 1) bits = (bits & 0x807fffffu) | ((97u + bits % 48u) << 23);
    float f = bits_f32(bits);
    _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    if (std::isnan(f)) continue;
    CHECK(cleave::from_float<half>(f).bits == want, "f16(%a): got %04x want %04x", f,
          cleave::from_float<half>(f).bits, want);
  }
#else
  (void)seed;
  std::printf("no _Float16 in this compiler: skipping the cross-check\n");
#endif
}

}  // namespace

int main() {
  shuffles(1);
  shuffles(2);
  packing(3);
  round_trips();
  midpoints<half>("f16", 0x7bff);
  midpoints<bf16>("bf16", 0x7f7f);
  against_compiler(4);
  CHECK(cleave::fast_exp2(3.0f) == 8.0f, "fast_exp2(3)");
  CHECK(test::close(rsqrtf(16.0f), 0.25, 1e-7), "rsqrtf(16)");
  return test::finish("shuffle");
}
