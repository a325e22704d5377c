// mma_m16n8k16 (f16 and bf16): operands distributed by the documented fragment ownership,
// results compared with a double-precision matmul of the same rounded values.
#include "test_util.h"

#include <cstring>
#include <vector>

using cleave::bf16;
using cleave::half;

namespace {

using MmaFn = void (*)(float*, const uint32_t*, const uint32_t*, const float*);

constexpr int kWarps = 4;

// One independent 16x16 * 16x8 + 16x8 problem per warp, so that warps are known not to mix.
template <class T>
struct Problem {
  T A[16][16];
  T B[16][8];  // k x n
  float C[16][8];
};

template <class T>
uint32_t pack(T lo, T hi) {
  return uint32_t(lo.bits) | (uint32_t(hi.bits) << 16);
}

template <class T>
void run_case(const char* name, MmaFn mma, uint64_t seed) {
  test::Rng rng(seed);
  std::vector<Problem<T>> p(kWarps);
  for (Problem<T>& q : p) {
    for (auto& row : q.A)
      for (T& v : row) v = cleave::from_float<T>(4.0f * rng.uniform());
    for (auto& row : q.B)
      for (T& v : row) v = cleave::from_float<T>(4.0f * rng.uniform());
    for (auto& row : q.C)
      for (float& v : row) v = 8.0f * rng.uniform();
  }
  // Per thread: the plain result, the result with d aliasing c, and a chained second mma.
  std::vector<float> D(kWarps * 32 * 4), Dalias(kWarps * 32 * 4), Dchain(kWarps * 32 * 4);
  int rc = test::run(test::config(1, 32 * kWarps), [&] {
    unsigned tid = threadIdx.x, w = tid / 32, l = tid % 32, g = l >> 2, t2 = (l & 3) * 2;
    const Problem<T>& q = p[w];
    uint32_t a[4] = {pack(q.A[g][t2], q.A[g][t2 + 1]), pack(q.A[g + 8][t2], q.A[g + 8][t2 + 1]),
                     pack(q.A[g][t2 + 8], q.A[g][t2 + 9]),
                     pack(q.A[g + 8][t2 + 8], q.A[g + 8][t2 + 9])};
    uint32_t b[2] = {pack(q.B[t2][g], q.B[t2 + 1][g]), pack(q.B[t2 + 8][g], q.B[t2 + 9][g])};
    float c[4] = {q.C[g][t2], q.C[g][t2 + 1], q.C[g + 8][t2], q.C[g + 8][t2 + 1]};
    float d[4];
    mma(d, a, b, c);
    std::memcpy(&D[tid * 4], d, sizeof d);
    mma(c, a, b, c);
    std::memcpy(&Dalias[tid * 4], c, sizeof c);
    mma(d, a, b, d);
    std::memcpy(&Dchain[tid * 4], d, sizeof d);
  });
  CHECK(rc == 0, "%s: launch failed", name);
  for (int w = 0; w < kWarps; ++w) {
    const Problem<T>& q = p[w];
    for (int l = 0; l < 32; ++l) {
      int g = l >> 2, t2 = (l & 3) * 2;
      const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {t2, t2 + 1, t2, t2 + 1};
      for (int i = 0; i < 4; ++i) {
        int r = rows[i], c = cols[i];
        double prod = 0;
        for (int k = 0; k < 16; ++k) {
          prod += double(cleave::to_float(q.A[r][k])) * double(cleave::to_float(q.B[k][c]));
        }
        double want = prod + q.C[r][c];
        double chained = prod + double(float(want));
        float got = D[(w * 32 + l) * 4 + i];
        CHECK(test::close(got, want, 1e-5),
              "%s warp %d lane %d d%d (row %d col %d): got %.9g want %.9g",
              name, w, l, i, r, c, got, want);
        CHECK(Dalias[(w * 32 + l) * 4 + i] == got, "%s: aliasing d and c changed the result",
              name);
        CHECK(test::close(Dchain[(w * 32 + l) * 4 + i], chained, 1e-5),
              "%s warp %d lane %d: chained mma got %.9g want %.9g", name, w, l,
              Dchain[(w * 32 + l) * 4 + i], chained);
      }
    }
  }
}

}  // namespace

int main() {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    run_case<half>("mma f16", [](float* d, const uint32_t* a, const uint32_t* b, const float* c) { cleave::mma_m16n8k16(d, a, b, c); }, seed);
    run_case<bf16>("mma bf16", [](float* d, const uint32_t* a, const uint32_t* b, const float* c) { cleave::mma_m16n8k16_bf16(d, a, b, c); }, seed + 100);
  }
  return test::finish("mma");
}
