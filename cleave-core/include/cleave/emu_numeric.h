// 16-bit floating-point storage types and conversions for the CPU emulator.
//
// On the device `cleave::half` and `cleave::bf16` are CUDA's `__half` and `__nv_bfloat16`; on the
// CPU they are these plain 16-bit structs. Kernels only store and convert them (arithmetic goes
// through float), so the structs carry no operators. Conversions from float round to nearest,
// ties to even, like `cvt.rn`: values past the largest finite half become infinity, tiny values
// become subnormals or signed zero, and a NaN stays a NaN with its sign and the top bits of its
// payload (the quiet bit is set only where the payload would otherwise become zero, so
// converting any 16-bit NaN to float and back reproduces it bit for bit).
#pragma once

#include <cstdint>
#include <cstring>

// The emulator's `__half`: IEEE 754 binary16 bits.
struct __half {
  uint16_t bits;
};

// The emulator's `__nv_bfloat16`: the upper 16 bits of an IEEE 754 binary32.
struct __nv_bfloat16 {
  uint16_t bits;
};

// CUDA's built-in vector types that the primitives use.
struct float2 {
  float x, y;
};
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
};

// The functions stay inside the including shared object (see emu.h).
#pragma GCC visibility push(hidden)

namespace cleave {

using half = ::__half;
using bf16 = ::__nv_bfloat16;

namespace emu {
namespace detail {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16_bits(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) {
    uint16_t payload = uint16_t((x >> 13) & 0x3ffu);
    return uint16_t(sign | 0x7c00u | (payload ? payload : 0x200u));
  }
  // 65520 is the midpoint between 65504 (the largest half) and 65536; it and everything above
  // round to infinity.
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (x >= 0x38800000u) {
    // Normal half: rebias the exponent (127 - 15 = 112) and round off 13 mantissa bits; a
    // carry out of the mantissa correctly bumps the exponent.
    uint32_t h = (x - 0x38000000u) >> 13;
    uint32_t rem = x & 0x1fffu;
    h += (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u;
    return uint16_t(sign | h);
  }
  // Below 2^-25 (half of the smallest subnormal, which itself ties to the even zero) the result
  // is zero.
  if (x <= 0x33000000u) return sign;
  // Subnormal half: the result counts units of 2^-24, i.e. the 24-bit significand shifted
  // right by 126 - exponent (between 14 and 24 here), rounded to nearest even. Rounding up to
  // 0x400 yields the smallest normal, whose encoding is exactly that.
  uint32_t exp = x >> 23;
  uint32_t mant = (x & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126u - exp;
  uint32_t h = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1u);
  h += (rem > halfway || (rem == halfway && (h & 1u))) ? 1u : 0u;
  return uint16_t(sign | h);
}

inline float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  // Subnormal or zero: mant * 2^-24 is exact in float.
  float mag = float(mant) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    uint16_t hi = uint16_t(x >> 16);
    return (hi & 0x7fu) ? hi : uint16_t(hi | 0x40u);
  }
  // Adding 0x7fff plus the lowest kept bit rounds to nearest even; overflow carries into the
  // exponent and ends at infinity, as it should.
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_f32(uint16_t b) { return bits_f32(uint32_t(b) << 16); }

}  // namespace detail
}  // namespace emu

inline float to_float(half h) { return emu::detail::f16_bits_to_f32(h.bits); }
inline float to_float(bf16 b) { return emu::detail::bf16_bits_to_f32(b.bits); }
inline float to_float(float f) { return f; }

template <class T>
T from_float(float f);
template <>
inline float from_float<float>(float f) {
  return f;
}
template <>
inline half from_float<half>(float f) {
  return half{emu::detail::f32_to_f16_bits(f)};
}
template <>
inline bf16 from_float<bf16>(float f) {
  return bf16{emu::detail::f32_to_bf16_bits(f)};
}

}  // namespace cleave

#pragma GCC visibility pop
