// Tile primitives called by Cleave's generated kernels.
//
// Compiled by nvcc (and CLEAVE_EMULATE not defined) this is the device implementation, mostly
// inline PTX for sm_80 and newer. Anywhere else it is the CPU emulation in `cleave/emu.h`, so
// one generated source serves both targets. `README.md` beside this file documents every
// primitive and its fragment layout.
#pragma once

#if defined(__CUDACC__) && !defined(CLEAVE_EMULATE)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace cleave {

using half = __half;
using bf16 = __nv_bfloat16;

__host__ __device__ __forceinline__ float to_float(half h) { return __half2float(h); }
__host__ __device__ __forceinline__ float to_float(bf16 b) { return __bfloat162float(b); }
__host__ __device__ __forceinline__ float to_float(float f) { return f; }

template <class T>
__host__ __device__ T from_float(float f);
template <>
__host__ __device__ __forceinline__ float from_float<float>(float f) {
  return f;
}
template <>
__host__ __device__ __forceinline__ half from_float<half>(float f) {
  return __float2half_rn(f);
}
template <>
__host__ __device__ __forceinline__ bf16 from_float<bf16>(float f) {
  return __float2bfloat16_rn(f);
}

namespace detail {
// The 32-bit shared-window address that ldmatrix and cp.async take.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The .global address that the .global forms of ld, st and cp.async take (the same bits as the
// generic pointer on current GPUs, but that is not promised).
__device__ __forceinline__ size_t gmem_addr(const void* p) { return __cvta_generic_to_global(p); }
}  // namespace detail

// The tensor-core product m16n8k16 and cp.async need sm_80. Generated kernels target sm_80 and
// newer (the runtime refuses older devices), but a plain `nvcc -c` compiles for nvcc's default
// architecture too; there the sm_80 instructions become a trap, so the source still compiles
// and a kernel launched on an unsupported device stops instead of computing garbage.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define CLEAVE_SM80_OR_TRAP(...) __trap()
#else
#define CLEAVE_SM80_OR_TRAP(...) __VA_ARGS__
#endif

// Warp-synchronous instructions are `asm volatile` so that the compiler never moves them into
// a branch that only part of the warp takes.
__device__ __forceinline__ void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                             const float c[4]) {
  CLEAVE_SM80_OR_TRAP(asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
        "f"(c[1]), "f"(c[2]), "f"(c[3])));
}

__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const uint32_t a[4],
                                                  const uint32_t b[2], const float c[4]) {
  CLEAVE_SM80_OR_TRAP(asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
        "f"(c[1]), "f"(c[2]), "f"(c[3])));
}

// The tf32 product m16n8k8: A holds rows g, g + 8 at depths t, t + 4 (g = lane / 4,
// t = lane % 4), B depths t, t + 4 of column g, each an f32 whose low 13 mantissa bits are
// zero (`tf32_rna`, `tf32_head`, or a widened f16 or bf16).
__device__ __forceinline__ void mma_m16n8k8_tf32(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                 const float c[4]) {
  CLEAVE_SM80_OR_TRAP(asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
        "f"(c[1]), "f"(c[2]), "f"(c[3])));
}

// x rounded to tf32 (to nearest, ties away from zero), as f32 bits.
__device__ __forceinline__ uint32_t tf32_rna(float x) {
  uint32_t r = 0;
  CLEAVE_SM80_OR_TRAP(asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x)));
  return r;
}

__device__ __forceinline__ uint32_t f32_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float f32_of_bits(uint32_t u) { return __uint_as_float(u); }

// v, hidden from the optimizer. At high register pressure ptxas recomputes lane-derived
// values inside a loop rather than keep them; a value it cannot see through it must keep (or
// spill, which the benchmarks would show). The generated code passes the per-thread ldmatrix
// offsets computed before a main loop through this.
__device__ __forceinline__ int opaque(int v) {
#if defined(__CUDA_ARCH__)
  asm("" : "+r"(v));
#endif
  return v;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(detail::smem_addr(smem_row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(detail::smem_addr(smem_row)));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(detail::smem_addr(smem_row)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(detail::smem_addr(smem_row)));
}

// With src-size below 16 the rest of the 16 bytes is zero-filled, and with 0 nothing is read.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes) {
  CLEAVE_SM80_OR_TRAP(asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   detail::smem_addr(smem_dst)),
               "l"(detail::gmem_addr(gmem_src)), "r"(src_bytes)));
}

// One 4-byte element (f32, i32): `cp.async` of 4 bytes goes through L1 (`.ca`; only 16-byte
// copies may bypass it). src-size 0 writes a zero and reads nothing. Both addresses 4-byte
// aligned.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, int src_bytes) {
  CLEAVE_SM80_OR_TRAP(asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                   detail::smem_addr(smem_dst)),
               "l"(detail::gmem_addr(gmem_src)), "r"(src_bytes)));
}

__device__ __forceinline__ void cp_async_commit() { CLEAVE_SM80_OR_TRAP(asm volatile("cp.async.commit_group;\n" ::)); }

// The memory clobber keeps the compiler from hoisting this thread's shared-memory reads above
// the wait.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(N >= 0, "cp_async_wait<N> needs N >= 0");
  CLEAVE_SM80_OR_TRAP(asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"));
}

// The butterflies below fix the reduction order; the emulator replays exactly these steps.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  return v;
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, s));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
  return v;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// cvt.rn.{f16,bf16}x2.f32 d, a, b puts a in the upper half of d and b in the lower half.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ uint32_t pack_bf162(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float2 unpack_half2(uint32_t v) {
  float2 r;
  asm("{\n  .reg .f16 lo, hi;\n  mov.b32 {lo, hi}, %2;\n  cvt.f32.f16 %0, lo;\n"
      "  cvt.f32.f16 %1, hi;\n}\n"
      : "=f"(r.x), "=f"(r.y)
      : "r"(v));
  return r;
}

// A bf16 is the upper half of an f32, so widening is a shift.
__device__ __forceinline__ float2 unpack_bf162(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

__device__ __forceinline__ void st_global_16(void* gmem, const void* src16) {
  uint4 v = *static_cast<const uint4*>(src16);
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"l"(detail::gmem_addr(gmem)),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ void ld_global_16(void* dst16, const void* gmem) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(detail::gmem_addr(gmem))
               : "memory");
  *static_cast<uint4*>(dst16) = v;
}

// Scalar accesses of generated kernels: shared memory at a byte address, global memory as
// element `i` of the array at `p`. Plain loads and stores here; the emulator checks them.
template <class T>
__device__ __forceinline__ T ld_shared(const void* p) {
  return *static_cast<const T*>(p);
}
template <class T>
__device__ __forceinline__ void st_shared(void* p, T v) {
  *static_cast<T*>(p) = v;
}
template <class T>
__device__ __forceinline__ T ld_global(const T* p, long long i) {
  return p[i];
}
template <class T>
__device__ __forceinline__ void st_global(T* p, long long i, T v) {
  p[i] = v;
}

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char cleave_dynamic_smem[];
  return cleave_dynamic_smem;
}

}  // namespace cleave

#else

#include "emu.h"

#endif

namespace cleave {

// Runs of 16-bit elements that one shared-memory load reads (8 or 16 bytes, aligned as such),
// as words of two elements each.
struct alignas(8) words2 {
  uint32_t w[2];
};
struct alignas(16) words4 {
  uint32_t w[4];
};

// Physical 16-byte chunk for logical `chunk` of `row` in a shared-memory tile whose rows are
// 128 bytes or wider (a multiple of 128). The 8 rows that one ldmatrix phase reads at the same
// logical chunk then land in 8 different 16-byte bank groups.
__host__ __device__ __forceinline__ int swizzle_chunk(int row, int chunk) {
  return chunk ^ (row & 7);
}

// The same for rows of `chunks_per_row` 16-byte chunks (a power of two). A 128-byte bank line
// holds 8 / chunks_per_row narrow rows, so rows are XOR-ed in groups of that many: 64-byte rows
// use chunk ^ ((row >> 1) & 3), 32-byte rows chunk ^ ((row >> 2) & 1), and 16-byte rows need no
// swizzle at all.
__host__ __device__ __forceinline__ int swizzle_chunk(int row, int chunk, int chunks_per_row) {
  if (chunks_per_row >= 8) return chunk ^ (row & 7);
  return chunk ^ ((row / (8 / chunks_per_row)) & (chunks_per_row - 1));
}


// An f32 operand of the tf32 products is split into a head and a tail, whose products with
// the other operand's head sum to within a few f32 roundings of the exact product. The head
// is the value rounded to tf32's 10 mantissa bits, or cut to them where rounding would
// overflow to infinity (within half a tf32 unit of the largest f32).
__device__ __forceinline__ uint32_t tf32_head(float x) {
  const uint32_t h = tf32_rna(x);
  return (h & 0x7fffffffu) == 0x7f800000u && isfinite(x) ? (f32_bits(x) & 0xffffe000u) : h;
}

// What the head leaves, exact in f32, rounded to tf32; nothing for an infinity or NaN, which
// the head carries alone.
__device__ __forceinline__ uint32_t tf32_tail(float x) {
  const float rest = x - f32_of_bits(tf32_head(x));
  return isfinite(rest) ? tf32_rna(rest) : 0u;
}

// Extended-exponent floats for the fallback stage kernels: m * 2^e with m zero, non-finite or
// of magnitude in [1, 2), so no value overflows or underflows where the true one does not. The
// same algorithms as `XFloat<f32>` in cleave-core's xfloat.rs: one f32 rounding per operation,
// exp and log through double.
struct xf {
  float m;
  int e;
};

__host__ __device__ __forceinline__ xf xf_norm(float m, long long e) {
  if (m == 0.0f || !isfinite(m)) return xf{m, 0};
  int k;
  const float f = frexpf(m, &k) * 2.0f;
  const long long n = e + k - 1;
  if (n > (1LL << 40)) return xf{copysignf(INFINITY, f), 0};
  if (n < -(1LL << 40)) return xf{copysignf(0.0f, f), 0};
  return xf{f, (int)n};
}

__host__ __device__ __forceinline__ xf xf_of_float(float x) { return xf_norm(x, 0); }

__host__ __device__ __forceinline__ xf xf_of_double(double x) {
  if (x == 0.0 || !isfinite(x)) return xf{(float)x, 0};
  int k;
  const double f = frexp(x, &k) * 2.0;
  return xf_norm((float)f, (long long)k - 1);
}

__host__ __device__ __forceinline__ float xf_to_float(xf a) { return ldexpf(a.m, a.e); }
__host__ __device__ __forceinline__ double xf_to_double(xf a) { return ldexp((double)a.m, a.e); }
__host__ __device__ __forceinline__ xf xf_one() { return xf{1.0f, 0}; }
__host__ __device__ __forceinline__ xf xf_neg(xf a) { return xf{-a.m, a.e}; }

__host__ __device__ __forceinline__ xf xf_add(xf a, xf b) {
  if (!isfinite(a.m) || !isfinite(b.m)) return xf{a.m + b.m, 0};
  if (b.m == 0.0f) return a.m == 0.0f ? xf{a.m + b.m, 0} : a;
  if (a.m == 0.0f) return b;
  const xf big = a.e >= b.e ? a : b, small = a.e >= b.e ? b : a;
  const long long d = (long long)big.e - small.e;
  // The smaller term is below half an ulp of the larger: the sum rounds to it.
  if (d > 26) return big;
  return xf_norm(big.m + ldexpf(small.m, -(int)d), big.e);
}

__host__ __device__ __forceinline__ xf xf_sub(xf a, xf b) { return xf_add(a, xf_neg(b)); }
__host__ __device__ __forceinline__ xf xf_mul(xf a, xf b) { return xf_norm(a.m * b.m, (long long)a.e + b.e); }
// 0 / 0 is 0, as everywhere in the language (a row that sees no key averages nothing).
__host__ __device__ __forceinline__ xf xf_div(xf a, xf b) {
  if (a.m == 0.0f && b.m == 0.0f) return xf{0.0f, 0};
  return xf_norm(a.m / b.m, (long long)a.e - b.e);
}

// a < b for non-NaN values.
__host__ __device__ __forceinline__ bool xf_less(xf a, xf b) {
  const int sa = a.m > 0.0f ? 1 : (a.m < 0.0f ? -1 : 0), sb = b.m > 0.0f ? 1 : (b.m < 0.0f ? -1 : 0);
  if (sa != sb) return sa < sb;
  if (sa == 0) return false;
  if (!isfinite(a.m) || !isfinite(b.m)) return a.m < b.m;
  const bool smaller = a.e < b.e || (a.e == b.e && fabsf(a.m) < fabsf(b.m));
  const bool larger = a.e > b.e || (a.e == b.e && fabsf(a.m) > fabsf(b.m));
  return sa > 0 ? smaller : larger;
}

// The larger; a NaN operand is ignored, as fmaxf does.
__host__ __device__ __forceinline__ xf xf_max(xf a, xf b) {
  if (isnan(a.m)) return b;
  if (isnan(b.m)) return a;
  return xf_less(a, b) ? b : a;
}

__host__ __device__ __forceinline__ xf xf_exp(xf a) {
  if (isnan(a.m)) return a;
  const double x = xf_to_double(a);
  if (x > 1.0e15) return xf{INFINITY, 0};
  if (x < -1.0e15) return xf{0.0f, 0};
  if (fabs(x) < 700.0) return xf_of_double(exp(x));
  // x = n ln2 + r, ln2 in two parts (Cody and Waite), so e^r keeps double precision.
  const double hi = 6.93147180369123816490e-01, lo = 1.90821492927058770002e-10;
  const double n = round(x * 1.4426950408889634);
  const double r = (x - n * hi) - n * lo;
  return xf_norm((float)exp(r), (long long)n);
}

__host__ __device__ __forceinline__ xf xf_log(xf a) {
  if (a.m <= 0.0f || !isfinite(a.m)) return xf{logf(a.m), 0};
  return xf_of_double(log((double)a.m) + (double)a.e * 0.6931471805599453);
}

__host__ __device__ __forceinline__ xf xf_sqrt(xf a) {
  if (a.m <= 0.0f || !isfinite(a.m)) return xf{sqrtf(a.m), 0};
  float m = a.m;
  int e = a.e;
  if (e % 2 != 0) {
    m += m;
    e -= 1;
  }
  return xf_norm(sqrtf(m), e / 2);
}

__host__ __device__ __forceinline__ xf xf_square(xf a) { return xf_mul(a, a); }
__host__ __device__ __forceinline__ xf xf_recip(xf a) { return xf_div(xf_one(), a); }
__host__ __device__ __forceinline__ xf xf_rsqrt(xf a) { return xf_div(xf_one(), xf_sqrt(a)); }

__host__ __device__ __forceinline__ xf xf_sigmoid(xf a) {
  return xf_div(xf_one(), xf_add(xf_one(), xf_exp(xf_neg(a))));
}
__host__ __device__ __forceinline__ xf xf_silu(xf a) { return xf_div(a, xf_add(xf_one(), xf_exp(xf_neg(a)))); }
__host__ __device__ __forceinline__ xf xf_gelu(xf a) {
  // erf saturates to +-1 long before double runs out: evaluate it on the clamped value.
  const double x = fmin(fmax(xf_to_double(a), -30.0), 30.0);
  return xf_mul(xf_mul(xf_of_double(0.5), a), xf_of_double(1.0 + erf(x / 1.4142135623730951)));
}

}  // namespace cleave
