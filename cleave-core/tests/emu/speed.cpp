// Speed sanity print (no assertion on time): fiber switches per second on one worker, for a
// shuffle-bound kernel and for an mma-bound one shaped like a generated attention kernel
// (blocks of 128 threads, a few thousand collectives per thread; generated kernels launch about
// 100 such blocks, this uses 25 to keep the test short). The results are checked so that the
// timing measures real work.
#include "test_util.h"

#include <chrono>
#include <cstdlib>
#include <vector>

namespace {

template <class F>
void timed(const char* name, const cleave_emu_launch& L, F&& body) {
  uint64_t before = cleave::emu::switch_count();
  auto t0 = std::chrono::steady_clock::now();
  int rc = test::run(L, body);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t switches = cleave::emu::switch_count() - before;
  CHECK(rc == 0, "%s: launch failed", name);
  std::printf("%s: %llu switches in %.3f s: %.1f M switches/s, %.1f ns per switch\n", name,
              (unsigned long long)switches, secs, switches / secs / 1e6, secs / switches * 1e9);
}

}  // namespace

int main() {
  setenv("CLEAVE_EMU_THREADS", "1", 1);
  constexpr int kBlocks = 25, kIters = 2000;

  std::vector<float> out(kBlocks * 128);
  timed("shuffle loop", test::config(kBlocks, 128), [&] {
    float v = float(threadIdx.x);
    for (int i = 0; i < kIters; ++i) {
      v = __shfl_xor_sync(0xffffffffu, v, 1 + i % 31);
      if (i % 64 == 0) __syncthreads();
    }
    out[blockIdx.x * 128 + threadIdx.x] = v;
  });
  // Each lane ends with the value of lane (lane ^ m1 ^ m2 ^ ...): compute that xor on the host.
  unsigned x = 0;
  for (int i = 0; i < kIters; ++i) x ^= 1 + i % 31;
  for (int t = 0; t < kBlocks * 128; ++t) {
    unsigned lane = t % 128;
    CHECK(out[t] == float((lane & ~31u) | ((lane & 31) ^ x)), "shuffle loop thread %d", t);
  }

  // mma + ldmatrix: each warp repeatedly multiplies a 16x16 tile by itself-derived operands.
  std::vector<float> acc_out(kBlocks * 128);
  timed("ldmatrix+mma loop", test::config(kBlocks, 128, 4 * 16 * 32), [&] {
    unsigned t = threadIdx.x, warp = t / 32, l = t % 32;
    unsigned char* tile = cleave::dynamic_smem() + warp * 16 * 32;
    for (int i = 0; i < 16; ++i) {
      reinterpret_cast<cleave::half*>(tile)[l * 8 + i % 8] =
          cleave::from_float<cleave::half>(0.01f * (i + 1));
    }
    __syncthreads();
    float acc[4] = {};
    for (int i = 0; i < kIters / 2; ++i) {
      uint32_t a[4], b[2];
      cleave::ldmatrix_x4(a, tile + (l % 16) * 32 + (l / 16) * 16);
      cleave::ldmatrix_x2_trans(b, tile + (l % 16) * 32);
      cleave::mma_m16n8k16(acc, a, b, acc);
    }
    acc_out[blockIdx.x * 128 + t] = acc[0] + acc[1] + acc[2] + acc[3];
  });
  for (int t = 1; t < kBlocks * 128; ++t) {
    CHECK(acc_out[t] == acc_out[t % 128], "mma loop: block-dependent result at thread %d", t);
  }
  CHECK(acc_out[0] > 0.0f, "mma loop produced %g", acc_out[0]);
  return test::finish("speed");
}
