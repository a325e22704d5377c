// __syncthreads as a real block barrier, and the emulation errors: deadlocks from divergent
// barriers, lanes that exit while warp-mates wait at a collective, mismatched collectives,
// partial warps, non-full shuffle masks, bad ldmatrix addresses and invalid launches. Each
// error must fail the launch with a message that names the block and thread.
#include "test_util.h"

#include <cstring>
#include <vector>

namespace {

// Tree reduction through shared memory across 4 warps (as a 32x4 block, so threadIdx.y takes
// part), compared bit for bit with the same tree on the host and loosely with the exact sum.
void block_reduction(uint64_t seed) {
  test::Rng rng(seed);
  constexpr int kBlocks = 5;
  std::vector<float> in(kBlocks * 128), out(kBlocks, 0.0f);
  for (float& v : in) v = rng.uniform();
  cleave_emu_launch L = test::config(kBlocks, 32, 128 * sizeof(float), seed);
  L.block[1] = 4;
  int rc = test::run(L, [&] {
    unsigned tid = threadIdx.x + 32 * threadIdx.y;
    float* s = reinterpret_cast<float*>(cleave::dynamic_smem());
    s[tid] = in[blockIdx.x * 128 + tid];
    __syncthreads();
    for (unsigned stride = 64; stride > 0; stride /= 2) {
      if (tid < stride) s[tid] += s[tid + stride];
      __syncthreads();
    }
    if (tid == 127) out[blockIdx.x] = s[0];
  });
  CHECK(rc == 0, "block_reduction: launch failed");
  for (int b = 0; b < kBlocks; ++b) {
    float t[128];
    std::memcpy(t, &in[b * 128], sizeof t);
    for (int stride = 64; stride > 0; stride /= 2)
      for (int i = 0; i < stride; ++i) t[i] += t[i + stride];
    double exact = 0;
    for (int i = 0; i < 128; ++i) exact += in[b * 128 + i];
    CHECK(out[b] == t[0], "block %d: got %.9g, host tree gives %.9g", b, out[b], t[0]);
    CHECK(test::close(out[b], exact, 1e-5), "block %d: got %.9g, exact sum %.9g", b, out[b], exact);
  }
}

// Threads 100..127 return at once; the others' barriers still complete because returned
// threads count as arrived.
void early_exit() {
  test::Rng rng(9);
  std::vector<float> in(100);
  for (float& v : in) v = rng.uniform();
  float out = 0;
  int rc = test::run(test::config(1, 128, 128 * sizeof(float)), [&] {
    unsigned tid = threadIdx.x;
    if (tid >= 100) return;
    float* s = reinterpret_cast<float*>(cleave::dynamic_smem());
    s[tid] = in[tid];
    __syncthreads();
    if (tid == 0) {
      float sum = 0;
      for (int i = 0; i < 100; ++i) sum += s[i];
      s[127] = sum;
    }
    __syncthreads();
    if (tid == 99) out = s[127];
  });
  CHECK(rc == 0, "early_exit: launch failed");
  float want = 0;
  for (float v : in) want += v;
  CHECK(out == want, "early_exit: got %.9g want %.9g", out, want);
}

// Runs a 3-block launch in which only block 2 misbehaves (`bad` is called with the thread
// index there, and with -1 elsewhere) and checks the message.
template <class F>
void expect_error(const char* name, unsigned block, F bad,
                  const std::vector<const char*>& needles) {
  std::string err;
  int rc = test::run(test::config(3, block, 256), [&] {
    bad(blockIdx.x == 2 ? int(threadIdx.x) : -1);
  }, &err);
  CHECK(rc != 0, "%s: launch succeeded", name);
  bool ok = err.find("block (2,0,0)") != std::string::npos;
  for (const char* n : needles) ok = ok && err.find(n) != std::string::npos;
  CHECK(ok, "%s: unexpected message '%s'", name, err.c_str());
  std::printf("%s -> %s\n", name, err.c_str());
}

void errors() {
  // Lanes 0..15 of warp 0 wait at one barrier while warp 1 reaches the other: two barriers of
  // divergent code, not one.
  expect_error("divergent barrier", 64, [](int t) {
    if (t < 0) return;
    if (t < 16) {
      __syncthreads();
    } else {
      __shfl_xor_sync(0xffffffffu, 1.0f, 1);
      __syncthreads();
    }
  }, {"barrier divergence hazard", "reached __syncthreads at line"});

  // Lane 5 returns while lanes 0..4 already wait at the shuffle.
  expect_error("exit at collective", 32, [](int t) {
    if (t == 5) return;
    cleave::quad_sum(float(t));
  }, {"thread (5,0,0)", "exited while 5 lanes of its warp wait at quad_sum"});

  // Lane 0 returns before the others reach the shuffle (they run later in round-robin order).
  expect_error("collective after exit", 32, [](int t) {
    if (t == 0) return;
    __shfl_sync(0xffffffffu, 1.0f, 0);
  }, {"thread (1,0,0)", "divergence hazard: reached __shfl_sync at line", "after 1 lanes of its warp exited"});

  expect_error("mismatched collectives", 32, [](int t) {
    if (t >= 0 && t < 16) {
      cleave::quad_sum(1.0f);
    } else {
      cleave::warp_sum(1.0f);
    }
  }, {"thread (16,0,0)", "reached warp_sum at line", "while 16 lanes of its warp wait at quad_sum"});

  // After a barrier and the exit of warp 0, lane 31 of warp 1 runs ahead to a second barrier
  // while its warp-mates wait for it at warp_max: with warp 0 gone, nothing can run.
  expect_error("deadlock", 64, [](int t) {
    if (t < 0) return;
    __syncthreads();
    if (t < 32) return;
    if (t == 63) {
      __syncthreads();
    } else {
      cleave::warp_max(1.0f);
    }
  }, {"deadlock", "1 threads wait at __syncthreads (first: thread (63,0,0))",
      "warp 1: 31 of 32 lanes wait at warp_max, but thread (63,0,0) waits at __syncthreads"});

  expect_error("partial warp", 48, [](int t) {
    if (t >= 32) __shfl_xor_sync(0xffffffffu, 1u, 1);
  }, {"thread (32,0,0)", "needs a full warp, but this warp has 16 threads"});

  expect_error("partial mask", 32, [](int t) {
    if (t >= 0) __shfl_xor_sync(0x0000ffffu, 1, 1);
  }, {"thread (0,0,0)", "mask 0x0000ffff"});

  // Lane 9 hands ldmatrix a row address past the 256-byte buffer; the message names lane 9,
  // not the lane that happened to complete the collective.
  expect_error("ldmatrix out of range", 32, [](int t) {
    unsigned char* s = cleave::dynamic_smem();
    uint32_t r[4];
    cleave::ldmatrix_x4(r, s + (t == 9 ? 256 : 16 * (threadIdx.x % 16)));
  }, {"thread (9,0,0)", "ldmatrix row address", "outside the block's 256 bytes"});

  std::string err;
  cleave_emu_launch L = test::config(1, 1024);
  L.block[1] = 2;
  int rc = test::run(L, [] {}, &err);
  CHECK(rc != 0 && err.find("invalid launch") != std::string::npos,
        "2048-thread block: rc %d message '%s'", rc, err.c_str());

  // A failed launch leaves nothing behind: the next one runs normally.
  block_reduction(77);
}

}  // namespace

int main() {
  block_reduction(1);
  block_reduction(2);
  early_exit();
  errors();
  return test::finish("barrier");
}
