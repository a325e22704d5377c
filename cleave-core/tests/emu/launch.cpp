// Launch mechanics: the seeded block order, results independent of seed and worker count,
// 3-D grid and block coordinates, the shared-memory garbage fill, and CLEAVE_EMU_STACK.
#include "test_util.h"

#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

void set_workers(int n) { setenv("CLEAVE_EMU_THREADS", std::to_string(n).c_str(), 1); }

// The order in which a single worker runs the 97 blocks of a launch.
std::vector<unsigned> block_order(uint64_t seed) {
  set_workers(1);
  std::vector<unsigned> order;
  int rc = test::run(test::config(97, 32, 0, seed), [&] {
    if (threadIdx.x == 0) order.push_back(blockIdx.x);
  });
  CHECK(rc == 0, "block_order: launch failed");
  return order;
}

void order() {
  std::vector<unsigned> a = block_order(1), b = block_order(2), a2 = block_order(1);
  CHECK(a == a2, "the same seed gave two different block orders");
  CHECK(a != b, "seeds 1 and 2 gave the same block order");
  for (const std::vector<unsigned>* o : {&a, &b}) {
    std::vector<unsigned> sorted = *o;
    std::sort(sorted.begin(), sorted.end());
    bool perm = sorted.size() == 97;
    for (unsigned i = 0; perm && i < 97; ++i) perm = sorted[i] == i;
    CHECK(perm, "block order is not a permutation of 0..96");
  }
  std::vector<unsigned> identity(97);
  for (unsigned i = 0; i < 97; ++i) identity[i] = i;
  CHECK(a != identity && b != identity, "block order is not shuffled");
}

// An order-independent kernel (each block reduces its own slice through shared memory and
// warp collectives) must produce identical bytes for any seed and any number of workers.
std::vector<float> reduce_blocks(uint64_t seed, int workers, const std::vector<float>& in) {
  set_workers(workers);
  std::vector<float> out(97 * 4);
  int rc = test::run(test::config(97, 128, 4 * sizeof(float), seed), [&] {
    unsigned t = threadIdx.x, b = blockIdx.x;
    float v = in[b * 128 + t];
    float s = cleave::warp_sum(v * v);
    float* sm = reinterpret_cast<float*>(cleave::dynamic_smem());
    if (t % 32 == 0) sm[t / 32] = s;
    __syncthreads();
    out[b * 4 + t / 32] = sm[(t / 32 + 1) % 4] + cleave::quad_max(v);
  });
  CHECK(rc == 0, "reduce_blocks: launch failed");
  return out;
}

void determinism() {
  test::Rng rng(5);
  std::vector<float> in(97 * 128);
  for (float& v : in) v = rng.uniform();
  std::vector<float> ref = reduce_blocks(1, 1, in);
  CHECK(std::any_of(ref.begin(), ref.end(), [](float v) { return v != 0.0f; }),
        "reduce_blocks produced zeros");
  for (auto [seed, workers] : {std::pair<uint64_t, int>{2, 1}, {1, 4}, {3, 3}, {99, 8}}) {
    std::vector<float> got = reduce_blocks(seed, workers, in);
    CHECK(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0,
          "seed %llu with %d workers changed the result", (unsigned long long)seed, workers);
  }
}

// Every thread of a 3-D grid of 3-D blocks writes its coordinates once.
void coordinates() {
  set_workers(2);
  cleave_emu_launch L = test::config(3, 8, 0, 11);
  L.grid[1] = 2;
  L.grid[2] = 2;
  L.block[1] = 4;
  L.block[2] = 2;
  constexpr int kThreads = 3 * 2 * 2 * 8 * 4 * 2;
  std::vector<int> hits(kThreads, 0);
  std::vector<unsigned> dims(kThreads * 6);
  int rc = test::run(L, [&] {
    unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned id = block * (blockDim.x * blockDim.y * blockDim.z) + thread;
    __syncthreads();
    ++hits[id];
    const unsigned d[6] = {blockDim.x, blockDim.y, blockDim.z, gridDim.x, gridDim.y, gridDim.z};
    std::memcpy(&dims[id * 6], d, sizeof d);
  });
  CHECK(rc == 0, "coordinates: launch failed");
  const unsigned want[6] = {8, 4, 2, 3, 2, 2};
  for (int i = 0; i < kThreads; ++i) {
    CHECK(hits[i] == 1, "thread %d ran %d times", i, hits[i]);
    CHECK(std::memcmp(&dims[i * 6], want, sizeof want) == 0, "thread %d saw wrong dimensions", i);
  }
}

// Dynamic shared memory is 128-byte aligned and refilled with 0xA5 for every block, even where
// the previous block on the same worker wrote something else.
void garbage_fill() {
  set_workers(1);
  int bad = 0, misaligned = 0;
  int rc = test::run(test::config(6, 32, 1000), [&] {
    unsigned char* s = cleave::dynamic_smem();
    if (reinterpret_cast<uintptr_t>(s) % 128) ++misaligned;
    for (unsigned i = threadIdx.x; i < 1000; i += 32) bad += s[i] != 0xA5;
    __syncthreads();
    for (unsigned i = threadIdx.x; i < 1000; i += 32) s[i] = static_cast<unsigned char>(i);
  });
  CHECK(rc == 0 && bad == 0 && misaligned == 0, "garbage fill: %d bytes not 0xA5, %d misaligned",
        bad, misaligned);
}

// A 160 KiB local array overflows the default 64 KiB stack but fits a 256K one.
void big_stack() {
  setenv("CLEAVE_EMU_STACK", "256K", 1);
  set_workers(2);
  std::vector<double> out(4 * 64);
  int rc = test::run(test::config(4, 64), [&] {
    volatile unsigned char big[160 << 10];
    for (size_t i = 0; i < sizeof big; i += 4096) big[i] = static_cast<unsigned char>(i >> 12);
    __syncthreads();
    double s = 0;
    for (size_t i = 0; i < sizeof big; i += 4096) s += big[i];
    out[blockIdx.x * 64 + threadIdx.x] = s + threadIdx.x;
  });
  unsetenv("CLEAVE_EMU_STACK");
  CHECK(rc == 0, "big_stack: launch failed");
  double want = 0;
  for (size_t i = 0; i < (160 << 10); i += 4096) want += (i >> 12) & 0xff;
  for (int i = 0; i < 4 * 64; ++i) CHECK(out[i] == want + i % 64, "big_stack thread %d", i);
}

}  // namespace

int main() {
  order();
  determinism();
  coordinates();
  garbage_fill();
  big_stack();
  return test::finish("launch");
}
