// ldmatrix layouts, the swizzle's bank spread, and end-to-end matmuls that chain
// cp_async_16 -> swizzled shared memory -> ldmatrix -> mma, checked against scalar references.
#include "test_util.h"

#include <algorithm>
#include <cstring>
#include <vector>

using cleave::bf16;
using cleave::half;

namespace {

using LdFn = void (*)(uint32_t*, const void*);

// Loads 4 (or 2) random 8x8 matrices of 16-bit values whose rows sit at shuffled 16-byte slots
// (rows need not be contiguous), and checks every lane's registers against the PTX layout:
// lane l gets (row l/4, cols 2(l%4), 2(l%4)+1) of matrix i in r[i], transposed for .trans.
void layout_case(const char* name, LdFn ld, int nmat, bool trans, uint64_t seed) {
  test::Rng rng(seed);
  uint16_t M[4][8][8];
  for (auto& m : M)
    for (auto& row : m)
      for (uint16_t& v : row) v = uint16_t(rng.next() | 1);
  int slot[32];
  for (int i = 0; i < 32; ++i) slot[i] = i;
  for (int i = 31; i > 0; --i) std::swap(slot[i], slot[rng.next() % (i + 1)]);
  uint32_t got[32][4] = {};
  int rc = test::run(test::config(1, 32, 32 * 16), [&] {
    unsigned l = threadIdx.x;
    unsigned char* smem = cleave::dynamic_smem();
    std::memcpy(smem + slot[l] * 16, M[l / 8][l % 8], 16);
    __syncthreads();
    // Only lanes 0..15 address rows for .x2; the others pass an address that must be ignored.
    const void* row = (nmat == 4 || l < 16) ? smem + slot[l] * 16 : nullptr;
    uint32_t r[4];
    ld(r, row);
    std::memcpy(got[l], r, 4 * nmat);
  });
  CHECK(rc == 0, "%s: launch failed", name);
  for (int l = 0; l < 32; ++l) {
    int g = l / 4, t2 = 2 * (l % 4);
    for (int i = 0; i < nmat; ++i) {
      uint16_t lo = trans ? M[i][t2][g] : M[i][g][t2];
      uint16_t hi = trans ? M[i][t2 + 1][g] : M[i][g][t2 + 1];
      uint32_t want = uint32_t(lo) | (uint32_t(hi) << 16);
      CHECK(got[l][i] == want, "%s lane %d r[%d]: got %08x want %08x", name, l, i, got[l][i],
            want);
    }
  }
}

// For every row width, the 8 rows of one ldmatrix phase (8 consecutive rows at the same
// logical chunk) must fall into 8 distinct 16-byte bank groups of the 128-byte bank line, and
// each row's chunks must stay a permutation.
void swizzle_banks() {
  for (int chunks = 1; chunks <= 16; chunks *= 2) {
    for (int row0 = 0; row0 < 64; row0 += 8) {
      for (int c = 0; c < chunks; ++c) {
        bool seen[8] = {};
        for (int r = row0; r < row0 + 8; ++r) {
          int byte = r * 16 * chunks + cleave::swizzle_chunk(r, c, chunks) * 16;
          int group = (byte / 16) % 8;
          CHECK(!seen[group], "%d-byte rows: rows %d..%d chunk %d collide in bank group %d",
                16 * chunks, row0, row0 + 7, c, group);
          seen[group] = true;
        }
      }
    }
    for (int r = 0; r < 64; ++r) {
      std::vector<bool> hit(chunks);
      for (int c = 0; c < chunks; ++c) {
        int p = cleave::swizzle_chunk(r, c, chunks);
        CHECK(p >= 0 && p < chunks && !hit[p], "%d-byte rows: row %d is not a permutation",
              16 * chunks, r);
        if (p >= 0 && p < chunks) hit[p] = true;
        if (chunks >= 8) {
          CHECK(p == cleave::swizzle_chunk(r, c), "two-argument swizzle differs at row %d", r);
        }
      }
    }
  }
  CHECK(cleave::swizzle_chunk(5, 3, 4) == (3 ^ ((5 >> 1) & 3)), "64-byte rule");
}

template <class T>
uint16_t bits(T v) {
  return v.bits;
}

// 16x16x16: one warp, A (row-major) and B (k x n, row-major) copied with cp_async_16 into
// 32-byte-row tiles swizzled with swizzle_chunk(row, chunk, 2); A via ldmatrix_x4, B via
// ldmatrix_x4_trans, two mma for the two 8-column halves.
void matmul16(uint64_t seed) {
  test::Rng rng(seed);
  alignas(16) half A[16 * 16], B[16 * 16];
  float C[16 * 16], D[16 * 16] = {};
  for (half& v : A) v = cleave::from_float<half>(rng.uniform());
  for (half& v : B) v = cleave::from_float<half>(rng.uniform());
  for (float& v : C) v = rng.uniform();
  int rc = test::run(test::config(1, 32, 1024), [&] {
    unsigned l = threadIdx.x;
    unsigned char* sA = cleave::dynamic_smem();
    unsigned char* sB = sA + 512;
    int row = l / 2, chunk = l % 2;
    int phys = cleave::swizzle_chunk(row, chunk, 2);
    cleave::cp_async_16(sA + row * 32 + phys * 16, A + row * 16 + chunk * 8, 16);
    cleave::cp_async_16(sB + row * 32 + phys * 16, B + row * 16 + chunk * 8, 16);
    cleave::cp_async_commit();
    cleave::cp_async_wait<0>();
    __syncthreads();
    int i = l / 8, r = l % 8;
    int arow = r + 8 * (i & 1), achunk = i >> 1;
    uint32_t a[4], b[4];
    cleave::ldmatrix_x4(a, sA + arow * 32 + cleave::swizzle_chunk(arow, achunk, 2) * 16);
    cleave::ldmatrix_x4_trans(b, sB + arow * 32 + cleave::swizzle_chunk(arow, achunk, 2) * 16);
    int g = l >> 2, t2 = (l & 3) * 2;
    for (int nt = 0; nt < 2; ++nt) {
      int col = nt * 8 + t2;
      float c[4] = {C[g * 16 + col], C[g * 16 + col + 1], C[(g + 8) * 16 + col],
                    C[(g + 8) * 16 + col + 1]};
      float d[4];
      cleave::mma_m16n8k16(d, a, b + 2 * nt, c);
      D[g * 16 + col] = d[0];
      D[g * 16 + col + 1] = d[1];
      D[(g + 8) * 16 + col] = d[2];
      D[(g + 8) * 16 + col + 1] = d[3];
    }
  });
  CHECK(rc == 0, "matmul16: launch failed");
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      double want = C[m * 16 + n];
      for (int k = 0; k < 16; ++k) {
        want += double(cleave::to_float(A[m * 16 + k])) * cleave::to_float(B[k * 16 + n]);
      }
      CHECK(test::close(D[m * 16 + n], want, 1e-5), "matmul16 (%d,%d): got %.9g want %.9g", m, n,
            D[m * 16 + n], want);
    }
  }
}

// 64x64x64 with 4 warps (16 output rows each) over 3 blocks (one independent problem per
// block). 128-byte rows use the plain swizzle_chunk(row, chunk). The K dimension arrives in two
// cp.async groups, and the first half is multiplied after cp_async_wait<1>() while the second
// may still be in flight.
template <class T>
void matmul64(const char* name, void (*mma)(float*, const uint32_t*, const uint32_t*,
                                            const float*),
              uint64_t seed) {
  constexpr int N = 64, kBlocks = 3;
  test::Rng rng(seed);
  struct alignas(16) Tile {
    T v[N * N];
  };
  std::vector<Tile> A(kBlocks), B(kBlocks);
  std::vector<float> D(kBlocks * N * N, 0.0f);
  for (int b = 0; b < kBlocks; ++b) {
    for (T& v : A[b].v) v = cleave::from_float<T>(rng.uniform());
    for (T& v : B[b].v) v = cleave::from_float<T>(rng.uniform());
  }
  int rc = test::run(test::config(kBlocks, 128, 2 * N * N * 2), [&] {
    unsigned tid = threadIdx.x, warp = tid / 32, l = tid % 32;
    const T* gA = A[blockIdx.x].v;
    const T* gB = B[blockIdx.x].v;
    float* gD = &D[blockIdx.x * N * N];
    unsigned char* sA = cleave::dynamic_smem();
    unsigned char* sB = sA + N * N * 2;
    auto at = [](unsigned char* base, int row, int chunk) {
      return base + row * 128 + cleave::swizzle_chunk(row, chunk) * 16;
    };
    for (int half_k = 0; half_k < 2; ++half_k) {
      for (int j = 0; j < 2; ++j) {
        int q = tid + 128 * j;  // 256 chunks of each operand per half
        int arow = q / 4, achunk = 4 * half_k + q % 4;
        cleave::cp_async_16(at(sA, arow, achunk), gA + arow * N + achunk * 8, 16);
        int brow = 32 * half_k + q / 8, bchunk = q % 8;
        cleave::cp_async_16(at(sB, brow, bchunk), gB + brow * N + bchunk * 8, 16);
      }
      cleave::cp_async_commit();
    }
    float acc[8][4] = {};
    int i = l / 8, r = l % 8;
    for (int half_k = 0; half_k < 2; ++half_k) {
      if (half_k == 0) {
        cleave::cp_async_wait<1>();
      } else {
        cleave::cp_async_wait<0>();
      }
      __syncthreads();
      for (int ks = 2 * half_k; ks < 2 * half_k + 2; ++ks) {
        uint32_t a[4];
        cleave::ldmatrix_x4(a, at(sA, 16 * warp + r + 8 * (i & 1), 2 * ks + (i >> 1)));
        for (int p = 0; p < 4; ++p) {
          uint32_t b[4];
          cleave::ldmatrix_x4_trans(b, at(sB, 16 * ks + r + 8 * (i & 1), 2 * p + (i >> 1)));
          mma(acc[2 * p], a, b, acc[2 * p]);
          mma(acc[2 * p + 1], a, b + 2, acc[2 * p + 1]);
        }
      }
    }
    int g = l >> 2, t2 = (l & 3) * 2, row = 16 * warp + g;
    for (int nt = 0; nt < 8; ++nt) {
      gD[row * N + nt * 8 + t2] = acc[nt][0];
      gD[row * N + nt * 8 + t2 + 1] = acc[nt][1];
      gD[(row + 8) * N + nt * 8 + t2] = acc[nt][2];
      gD[(row + 8) * N + nt * 8 + t2 + 1] = acc[nt][3];
    }
  });
  CHECK(rc == 0, "%s: launch failed", name);
  for (int b = 0; b < kBlocks; ++b) {
    for (int m = 0; m < N; ++m) {
      for (int n = 0; n < N; ++n) {
        double want = 0;
        for (int k = 0; k < N; ++k) {
          want += double(cleave::to_float(A[b].v[m * N + k])) * cleave::to_float(B[b].v[k * N + n]);
        }
        float got = D[(b * N + m) * N + n];
        CHECK(test::close(got, want, 1e-5), "%s block %d (%d,%d): got %.9g want %.9g", name, b, m,
              n, got, want);
      }
    }
  }
}

}  // namespace

int main() {
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    layout_case("ldmatrix_x4", [](uint32_t* r, const void* p) { cleave::ldmatrix_x4(r, p); }, 4, false, seed);
    layout_case("ldmatrix_x4_trans", [](uint32_t* r, const void* p) { cleave::ldmatrix_x4_trans(r, p); }, 4, true, seed + 10);
    layout_case("ldmatrix_x2", [](uint32_t* r, const void* p) { cleave::ldmatrix_x2(r, p); }, 2, false, seed + 20);
    layout_case("ldmatrix_x2_trans", [](uint32_t* r, const void* p) { cleave::ldmatrix_x2_trans(r, p); }, 2, true, seed + 30);
    matmul16(seed + 40);
  }
  swizzle_banks();
  matmul64<half>("matmul64 f16", [](float* d, const uint32_t* a, const uint32_t* b, const float* c) { cleave::mma_m16n8k16(d, a, b, c); }, 7);
  matmul64<bf16>("matmul64 bf16", [](float* d, const uint32_t* a, const uint32_t* b, const float* c) { cleave::mma_m16n8k16_bf16(d, a, b, c); }, 8);
  return test::finish("ldmatrix");
}
