// Kernels written the way Cleave's generator emits them, using every primitive of tile.cuh:
// a FlashAttention-style forward pass (f16 and bf16), a warp-per-row softmax, and a 16x8x16
// product that uses the .x2 ldmatrix forms. Built with -DCLEAVE_EMULATE this is a test program
// that runs them through their `cleave_emu_*` entry points (as the Rust runtime does) and checks
// them against double-precision references; compiled by nvcc (-x cu) the same file must build
// for sm_80 and sm_90 without register spills.
#include <cleave/tile.cuh>

namespace {

constexpr int kD = 64;         // head dimension
constexpr int kBr = 64;        // query rows per block, 16 per warp
constexpr int kBc = 64;        // keys per tile
constexpr int kThreads = 128;  // 4 warps
constexpr int kRowBytes = kD * 2;

template <class T>
struct Elem;

template <>
struct Elem<cleave::half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    return cleave::pack_half2(lo, hi);
  }
  static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2],
                                             const float c[4]) {
    cleave::mma_m16n8k16(d, a, b, c);
  }
};

template <>
struct Elem<cleave::bf16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    return cleave::pack_bf162(lo, hi);
  }
  static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2],
                                             const float c[4]) {
    cleave::mma_m16n8k16_bf16(d, a, b, c);
  }
};

// A 16-byte chunk of a 64-row tile with 128-byte rows, swizzled so that ldmatrix is
// conflict-free.
__device__ __forceinline__ unsigned char* tile_at(unsigned char* base, int row, int chunk) {
  return base + row * kRowBytes + cleave::swizzle_chunk(row, chunk) * 16;
}

// O = softmax(Q K^T * scale) V for one head, and lse = log(sum(exp(Q K^T * scale))) per query.
template <class T>
__device__ __forceinline__ void attn_fwd(const T* __restrict__ q, const T* __restrict__ k,
                                         const T* __restrict__ v, T* __restrict__ o,
                                         float* __restrict__ lse, long long sq, long long sk,
                                         float scale) {
  unsigned char* sQ = cleave::dynamic_smem();
  unsigned char* sK = sQ + kBr * kRowBytes;
  unsigned char* sV = sK + kBc * kRowBytes;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t2 = (lane & 3) * 2, mi = lane / 8, mr = lane % 8;
  const long long q0 = (long long)blockIdx.x * kBr;

  // Q goes through registers with plain 16-byte loads; rows past the end become zeros.
  for (int c = tid; c < kBr * 8; c += kThreads) {
    int row = c / 8, chunk = c % 8;
    unsigned char* dst = tile_at(sQ, row, chunk);
    if (q0 + row < sq) {
      cleave::ld_global_16(dst, q + (q0 + row) * kD + chunk * 8);
    } else {
      for (int i = 0; i < 4; ++i) reinterpret_cast<uint32_t*>(dst)[i] = 0u;
    }
  }

  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float acc_o[8][4];
  for (int d = 0; d < 8; ++d)
    for (int e = 0; e < 4; ++e) acc_o[d][e] = 0.0f;
  const float scale_log2 = scale * 1.4426950408889634f;
  const int ntiles = int((sk + kBc - 1) / kBc);
  for (int j = 0; j < ntiles; ++j) {
    const long long k0 = (long long)j * kBc;
    // K and V tiles arrive by cp.async; keys past the end are zero-filled without a read.
    for (int c = tid; c < kBc * 8; c += kThreads) {
      int row = c / 8, chunk = c % 8;
      bool valid = k0 + row < sk;
      long long src = (valid ? k0 + row : 0) * kD + chunk * 8;
      cleave::cp_async_16(tile_at(sK, row, chunk), k + src, valid ? 16 : 0);
      cleave::cp_async_16(tile_at(sV, row, chunk), v + src, valid ? 16 : 0);
    }
    cleave::cp_async_commit();
    cleave::cp_async_wait<0>();
    __syncthreads();

    // S = Q K^T: K rows are keys, so the non-transposed ldmatrix yields the col-major B operand.
    float s[8][4];
    for (int n = 0; n < 8; ++n)
      for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint32_t a[4];
      cleave::ldmatrix_x4(a, tile_at(sQ, 16 * warp + mr + 8 * (mi & 1), 2 * ks + (mi >> 1)));
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        uint32_t b[4];
        cleave::ldmatrix_x4(b, tile_at(sK, 16 * p + mr + 8 * (mi >> 1), 2 * ks + (mi & 1)));
        Elem<T>::mma(s[2 * p], a, b, s[2 * p]);
        Elem<T>::mma(s[2 * p + 1], a, b + 2, s[2 * p + 1]);
      }
    }

    // Online softmax in base 2; this thread holds rows g (h = 0) and g + 8 (h = 1).
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        long long key = k0 + n * 8 + t2 + (e & 1);
        s[n][e] = key < sk ? s[n][e] * scale_log2 : -INFINITY;
        row_max[e >> 1] = fmaxf(row_max[e >> 1], s[n][e]);
      }
    }
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_new = fmaxf(m_run[h], cleave::quad_max(row_max[h]));
      corr[h] = cleave::fast_exp2(m_run[h] - m_new);
      m_run[h] = m_new;
      l_run[h] *= corr[h];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = cleave::fast_exp2(s[n][e] - m_run[e >> 1]);
        l_run[e >> 1] += s[n][e];
      }
    }
#pragma unroll
    for (int d = 0; d < 8; ++d)
      for (int e = 0; e < 4; ++e) acc_o[d][e] *= corr[e >> 1];

    // O += P V: the accumulator layout of two adjacent key tiles is the A layout of one
    // 16-key step, and V (keys x d, row-major) needs the transposed ldmatrix.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4] = {Elem<T>::pack(s[2 * kk][0], s[2 * kk][1]),
                       Elem<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                       Elem<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                       Elem<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int qd = 0; qd < 4; ++qd) {
        uint32_t b[4];
        cleave::ldmatrix_x4_trans(b, tile_at(sV, 16 * kk + mr + 8 * (mi & 1), 2 * qd + (mi >> 1)));
        Elem<T>::mma(acc_o[2 * qd], a, b, acc_o[2 * qd]);
        Elem<T>::mma(acc_o[2 * qd + 1], a, b + 2, acc_o[2 * qd + 1]);
      }
    }
    __syncthreads();
  }

  float inv_l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = cleave::quad_sum(l_run[h]);
    inv_l[h] = 1.0f / l;
    long long row = q0 + 16 * warp + g + 8 * h;
    if ((lane & 3) == 0 && row < sq) lse[row] = m_run[h] * 0.6931471805599453f + logf(l);
  }
  // The normalized tile is staged in the Q buffer (free after the loop's last barrier) so that
  // the global stores are whole 16-byte rows.
#pragma unroll
  for (int d = 0; d < 8; ++d) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int row = 16 * warp + g + 8 * h, col = d * 8 + t2;
      *reinterpret_cast<uint32_t*>(tile_at(sQ, row, col / 8) + (col % 8) * 2) =
          Elem<T>::pack(acc_o[d][2 * h] * inv_l[h], acc_o[d][2 * h + 1] * inv_l[h]);
    }
  }
  __syncthreads();
  for (int c = tid; c < kBr * 8; c += kThreads) {
    int row = c / 8, chunk = c % 8;
    if (q0 + row < sq) {
      cleave::st_global_16(o + (q0 + row) * kD + chunk * 8, tile_at(sQ, row, chunk));
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(128)
    cleave_attn_fwd_f16(const cleave::half* __restrict__ q, const cleave::half* __restrict__ k,
                        const cleave::half* __restrict__ v, cleave::half* __restrict__ o,
                        float* __restrict__ lse, long long sq, long long sk, float scale) {
  attn_fwd(q, k, v, o, lse, sq, sk, scale);
}

extern "C" __global__ void __launch_bounds__(128)
    cleave_attn_fwd_bf16(const cleave::bf16* __restrict__ q, const cleave::bf16* __restrict__ k,
                         const cleave::bf16* __restrict__ v, cleave::bf16* __restrict__ o,
                         float* __restrict__ lse, long long sq, long long sk, float scale) {
  attn_fwd(q, k, v, o, lse, sq, sk, scale);
}

// One warp per row of 64 bf16 values: y = softmax(x) and stats = {max, 1/rms, rms}.
extern "C" __global__ void __launch_bounds__(128)
    cleave_row_softmax(const cleave::bf16* __restrict__ x, cleave::bf16* __restrict__ y,
                       float* __restrict__ stats, long long rows) {
  long long row = (long long)blockIdx.x * 4 + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  float2 v = cleave::unpack_bf162(reinterpret_cast<const uint32_t*>(x + row * 64)[lane]);
  // warp_max leaves the same value in every lane; the broadcast from lane 0 states that the
  // maximum is warp-uniform.
  float m = __shfl_sync(0xffffffffu, cleave::warp_max(fmaxf(v.x, v.y)), 0);
  float e0 = expf(v.x - m), e1 = expf(v.y - m);
  float inv = 1.0f / cleave::warp_sum(e0 + e1);
  reinterpret_cast<uint32_t*>(y + row * 64)[lane] =
      cleave::pack_bf162(fminf(e0 * inv, 1.0f), fminf(e1 * inv, 1.0f));
  float mean_sq = cleave::warp_sum(v.x * v.x + v.y * v.y) / 64.0f;
  if (lane == 0) {
    stats[row * 3] = cleave::to_float(cleave::from_float<cleave::bf16>(m));
    stats[row * 3 + 1] = rsqrtf(mean_sq);
    stats[row * 3 + 2] = sqrtf(mean_sq);
  }
}

// D = A B + A Bt^T for one warp: A (16x16) and Bt (8x16, i.e. B^T) have 32-byte rows and B
// (16x8) 16-byte rows, so this is where the narrow-row swizzle and the .x2 ldmatrix forms are
// used. Writes D as f32 and rounded to f16.
extern "C" __global__ void __launch_bounds__(32)
    cleave_mm16x8(const cleave::half* __restrict__ a, const cleave::half* __restrict__ b,
                  const cleave::half* __restrict__ bt, float* __restrict__ d,
                  cleave::half* __restrict__ dh) {
  unsigned char* sA = cleave::dynamic_smem();
  unsigned char* sB = sA + 16 * 32;
  unsigned char* sBt = sB + 16 * 16;
  const int lane = threadIdx.x, g = lane >> 2, t2 = (lane & 3) * 2;
  cleave::cp_async_16(sA + (lane / 2) * 32 + cleave::swizzle_chunk(lane / 2, lane % 2, 2) * 16,
                      a + lane * 8, 16);
  if (lane < 16) {
    cleave::cp_async_16(sB + lane * 16, b + lane * 8, 16);
  } else {
    int r = (lane - 16) / 2, c = lane % 2;
    cleave::cp_async_16(sBt + r * 32 + cleave::swizzle_chunk(r, c, 2) * 16, bt + r * 16 + c * 8,
                        16);
  }
  cleave::cp_async_commit();
  cleave::cp_async_wait<0>();
  __syncthreads();
  int mi = lane / 8, mr = lane % 8, l16 = lane % 16;
  uint32_t fa[4], fb[2], fbt[2];
  int arow = mr + 8 * (mi & 1);
  cleave::ldmatrix_x4(fa, sA + arow * 32 + cleave::swizzle_chunk(arow, mi >> 1, 2) * 16);
  cleave::ldmatrix_x2_trans(fb, sB + l16 * 16);
  cleave::ldmatrix_x2(fbt, sBt + (l16 % 8) * 32 + cleave::swizzle_chunk(l16 % 8, l16 / 8, 2) * 16);
  float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc[4];
  cleave::mma_m16n8k16(acc, fa, fb, c0);
  cleave::mma_m16n8k16(acc, fa, fbt, acc);
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {t2, t2 + 1, t2, t2 + 1};
  for (int i = 0; i < 4; ++i) d[rows[i] * 8 + cols[i]] = acc[i];
  for (int h = 0; h < 2; ++h) {
    float2 r = cleave::unpack_half2(cleave::pack_half2(acc[2 * h], acc[2 * h + 1]));
    dh[rows[2 * h] * 8 + t2] = cleave::from_float<cleave::half>(r.x);
    dh[rows[2 * h] * 8 + t2 + 1] = cleave::from_float<cleave::half>(r.y);
  }
}

#ifdef CLEAVE_EMULATE
// The entry points the Rust runtime calls: arguments arrive as an array of pointers to values.
extern "C" int cleave_emu_cleave_attn_fwd_f16(const cleave_emu_launch* L, void* const* args) {
  return cleave::emu::launch(L, [&] {
    cleave_attn_fwd_f16(*(const cleave::half* const*)args[0], *(const cleave::half* const*)args[1],
                        *(const cleave::half* const*)args[2], *(cleave::half* const*)args[3],
                        *(float* const*)args[4], *(const long long*)args[5],
                        *(const long long*)args[6], *(const float*)args[7]);
  });
}

extern "C" int cleave_emu_cleave_attn_fwd_bf16(const cleave_emu_launch* L, void* const* args) {
  return cleave::emu::launch(L, [&] {
    cleave_attn_fwd_bf16(*(const cleave::bf16* const*)args[0], *(const cleave::bf16* const*)args[1],
                         *(const cleave::bf16* const*)args[2], *(cleave::bf16* const*)args[3],
                         *(float* const*)args[4], *(const long long*)args[5],
                         *(const long long*)args[6], *(const float*)args[7]);
  });
}

extern "C" int cleave_emu_cleave_row_softmax(const cleave_emu_launch* L, void* const* args) {
  return cleave::emu::launch(L, [&] {
    cleave_row_softmax(*(const cleave::bf16* const*)args[0], *(cleave::bf16* const*)args[1],
                       *(float* const*)args[2], *(const long long*)args[3]);
  });
}

extern "C" int cleave_emu_cleave_mm16x8(const cleave_emu_launch* L, void* const* args) {
  return cleave::emu::launch(L, [&] {
    cleave_mm16x8(*(const cleave::half* const*)args[0], *(const cleave::half* const*)args[1],
                  *(const cleave::half* const*)args[2], *(float* const*)args[3],
                  *(cleave::half* const*)args[4]);
  });
}

#include <cmath>
#include <vector>

#include "test_util.h"

namespace {

constexpr unsigned kAttnSmem = 3 * kBr * kRowBytes;

template <class T>
void check_attention(const char* name, int (*entry)(const cleave_emu_launch*, void* const*),
                     double tol, uint64_t seed) {
  const long long sq = 100, sk = 150;
  const float scale = rsqrtf(float(kD));
  test::Rng rng(seed);
  std::vector<T> q(sq * kD), k(sk * kD), v(sk * kD), o(sq * kD);
  std::vector<float> lse(sq, 0.0f);
  for (T& x : q) x = cleave::from_float<T>(2.0f * rng.uniform());
  for (T& x : k) x = cleave::from_float<T>(2.0f * rng.uniform());
  for (T& x : v) x = cleave::from_float<T>(rng.uniform());
  const T* pq = q.data();
  const T* pk = k.data();
  const T* pv = v.data();
  T* po = o.data();
  float* plse = lse.data();
  void* args[] = {&pq, &pk, &pv, &po, &plse, const_cast<long long*>(&sq),
                  const_cast<long long*>(&sk), const_cast<float*>(&scale)};
  cleave_emu_launch L = test::config(unsigned((sq + kBr - 1) / kBr), kThreads, kAttnSmem, seed);
  char err[512] = {0};
  L.err = err;
  L.err_len = sizeof err;
  int rc = entry(&L, args);
  CHECK(rc == 0, "%s: %s", name, err);
  for (long long i = 0; i < sq; ++i) {
    std::vector<double> p(sk);
    double mx = -INFINITY, sum = 0;
    for (long long j = 0; j < sk; ++j) {
      double dot = 0;
      for (int d = 0; d < kD; ++d) {
        dot += double(cleave::to_float(q[i * kD + d])) * cleave::to_float(k[j * kD + d]);
      }
      p[j] = dot * scale;
      mx = std::fmax(mx, p[j]);
    }
    for (double& x : p) sum += (x = std::exp(x - mx));
    CHECK(test::close(lse[i], mx + std::log(sum), 1e-4), "%s lse[%lld]: got %.7g want %.7g", name,
          i, lse[i], mx + std::log(sum));
    for (int d = 0; d < kD; ++d) {
      double want = 0;
      for (long long j = 0; j < sk; ++j) want += p[j] * cleave::to_float(v[j * kD + d]);
      want /= sum;
      float got = cleave::to_float(o[i * kD + d]);
      CHECK(std::fabs(got - want) <= tol, "%s o[%lld][%d]: got %.6g want %.6g", name, i, d, got,
            want);
    }
  }
}

void check_softmax(uint64_t seed) {
  const long long rows = 10;
  test::Rng rng(seed);
  std::vector<cleave::bf16> x(rows * 64), y(rows * 64);
  std::vector<float> stats(rows * 3, 0.0f);
  for (cleave::bf16& e : x) e = cleave::from_float<cleave::bf16>(3.0f * rng.uniform());
  const cleave::bf16* px = x.data();
  cleave::bf16* py = y.data();
  float* ps = stats.data();
  void* args[] = {&px, &py, &ps, const_cast<long long*>(&rows)};
  cleave_emu_launch L = test::config(3, 128, 0, seed);  // the last block has 2 idle warps
  char err[512] = {0};
  L.err = err;
  L.err_len = sizeof err;
  CHECK(cleave_emu_cleave_row_softmax(&L, args) == 0, "row_softmax: %s", err);
  for (long long r = 0; r < rows; ++r) {
    double mx = -INFINITY, sum = 0, sq = 0;
    for (int i = 0; i < 64; ++i) {
      double e = cleave::to_float(x[r * 64 + i]);
      mx = std::fmax(mx, e);
      sq += e * e;
    }
    for (int i = 0; i < 64; ++i) sum += std::exp(cleave::to_float(x[r * 64 + i]) - mx);
    for (int i = 0; i < 64; ++i) {
      double want = std::exp(cleave::to_float(x[r * 64 + i]) - mx) / sum;
      float got = cleave::to_float(y[r * 64 + i]);
      CHECK(std::fabs(got - want) <= 4e-3 * want + 1e-6, "softmax[%lld][%d]: got %g want %g", r,
            i, got, want);
    }
    CHECK(stats[r * 3] == float(mx), "softmax max of row %lld", r);
    CHECK(test::close(stats[r * 3 + 1], 1.0 / std::sqrt(sq / 64), 1e-5), "1/rms of row %lld", r);
    CHECK(test::close(stats[r * 3 + 2], std::sqrt(sq / 64), 1e-5), "rms of row %lld", r);
  }
}

void check_mm16x8(uint64_t seed) {
  test::Rng rng(seed);
  alignas(16) cleave::half a[16 * 16], b[16 * 8], bt[8 * 16];
  float d[16 * 8] = {};
  cleave::half dh[16 * 8] = {};
  for (cleave::half& e : a) e = cleave::from_float<cleave::half>(rng.uniform());
  for (cleave::half& e : b) e = cleave::from_float<cleave::half>(rng.uniform());
  for (cleave::half& e : bt) e = cleave::from_float<cleave::half>(rng.uniform());
  const cleave::half *pa = a, *pb = b, *pbt = bt;
  float* pd = d;
  cleave::half* pdh = dh;
  void* args[] = {&pa, &pb, &pbt, &pd, &pdh};
  cleave_emu_launch L = test::config(1, 32, 16 * 32 + 16 * 16 + 8 * 32, seed);
  char err[512] = {0};
  L.err = err;
  L.err_len = sizeof err;
  CHECK(cleave_emu_cleave_mm16x8(&L, args) == 0, "mm16x8: %s", err);
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      double ab = 0, abt = 0;
      for (int k = 0; k < 16; ++k) {
        ab += double(cleave::to_float(a[m * 16 + k])) * cleave::to_float(b[k * 8 + n]);
        abt += double(cleave::to_float(a[m * 16 + k])) * cleave::to_float(bt[n * 16 + k]);
      }
      double want = double(float(ab)) + abt;
      CHECK(test::close(d[m * 8 + n], want, 1e-5), "mm16x8 (%d,%d): got %.9g want %.9g", m, n,
            d[m * 8 + n], want);
      CHECK(dh[m * 8 + n].bits == cleave::from_float<cleave::half>(d[m * 8 + n]).bits,
            "mm16x8 f16 copy (%d,%d)", m, n);
    }
  }
}

}  // namespace

int main() {
  check_attention<cleave::half>("attention f16", &cleave_emu_cleave_attn_fwd_f16, 4e-3, 1);
  check_attention<cleave::bf16>("attention bf16", &cleave_emu_cleave_attn_fwd_bf16, 2.5e-2, 2);
  check_softmax(3);
  check_mm16x8(4);
  return test::finish("all_primitives");
}
#endif  // CLEAVE_EMULATE
