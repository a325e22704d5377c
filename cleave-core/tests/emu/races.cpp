// The emulator's sanitizer: shared-memory races (read-after-write, write-after-read,
// write-after-write) between threads with no barrier in between, cp.async destinations used
// before their wait, collectives and barriers in divergent code, global accesses outside their
// buffer; and the schedules, which must never change the result of a correct kernel.
#include "test_util.h"

#include <cstring>
#include <vector>

namespace {

cleave_emu_launch checked(unsigned grid, unsigned block, unsigned smem, uint32_t schedule = 0, uint64_t seed = 1) {
  cleave_emu_launch L = test::config(grid, block, smem, seed);
  L.checks = CLEAVE_EMU_CHECK_RACES | CLEAVE_EMU_CHECK_BOUNDS;
  L.schedule = schedule;
  return L;
}

// Runs `body` in a checked launch and expects a failure whose message has every needle.
template <class F>
void expect(const char* name, cleave_emu_launch L, F body, const std::vector<const char*>& needles) {
  std::string err;
  int rc = test::run(L, body, &err);
  bool ok = rc != 0;
  for (const char* n : needles) ok = ok && err.find(n) != std::string::npos;
  CHECK(ok, "%s: rc %d, message '%s'", name, rc, err.c_str());
  std::printf("%s -> %s\n", name, err.c_str());
}

// Runs `body` in a checked launch and expects it to pass.
template <class F>
void clean(const char* name, cleave_emu_launch L, F body) {
  std::string err;
  int rc = test::run(L, body, &err);
  CHECK(rc == 0, "%s: unexpected failure '%s'", name, err.c_str());
}

void races() {
  // Thread 40 reads what thread 3 wrote, with and without a barrier between.
  expect("read-after-write", checked(1, 64, 256), [] {
    unsigned char* s = cleave::dynamic_smem();
    if (threadIdx.x == 3) cleave::st_shared<float>(s + 12, 1.0f);
    if (threadIdx.x == 40) (void)cleave::ld_shared<float>(s + 12);
  }, {"thread (40,0,0)", "race (read-after-write) at byte 12", "thread (3,0,0) wrote it"});
  clean("read after a barrier", checked(1, 64, 256), [] {
    unsigned char* s = cleave::dynamic_smem();
    if (threadIdx.x == 3) cleave::st_shared<float>(s + 12, 1.0f);
    __syncthreads();
    if (threadIdx.x == 40) (void)cleave::ld_shared<float>(s + 12);
  });
  // Thread 3 runs first (round-robin), so its read comes before thread 40's write.
  expect("write-after-read", checked(1, 64, 256), [] {
    unsigned char* s = cleave::dynamic_smem();
    if (threadIdx.x == 3) (void)cleave::ld_shared<cleave::half>(s + 2);
    if (threadIdx.x == 40) cleave::st_shared<cleave::half>(s + 2, cleave::from_float<cleave::half>(1.0f));
  }, {"thread (40,0,0)", "race (write-after-read) at byte 2", "thread (3,0,0) read it"});
  expect("write-after-write", checked(1, 64, 256), [] {
    unsigned char* s = cleave::dynamic_smem();
    if (threadIdx.x == 0 || threadIdx.x == 33) cleave::st_shared<uint32_t>(s + 64, threadIdx.x);
  }, {"thread (33,0,0)", "race (write-after-write) at byte 64"});
  // A thread may read back its own writes, and many threads may read one byte.
  clean("own writes and shared reads", checked(1, 64, 256), [] {
    unsigned char* s = cleave::dynamic_smem();
    cleave::st_shared<float>(s + 4 * threadIdx.x, 2.0f);
    float v = cleave::ld_shared<float>(s + 4 * threadIdx.x);
    __syncthreads();
    v += cleave::ld_shared<float>(s);
    (void)v;
  });
  // Lanes of one warp race too: only a barrier orders them.
  expect("intra-warp race", checked(1, 32, 256), [] {
    unsigned char* s = cleave::dynamic_smem();
    if (threadIdx.x == 1) cleave::st_shared<float>(s, 1.0f);
    if (threadIdx.x == 2) (void)cleave::ld_shared<float>(s);
  }, {"thread (2,0,0)", "read-after-write"});
  // ldmatrix reads 16 bytes per lane; warp 0 runs first, so thread 37 then overwrites bytes
  // the ldmatrix read, with no barrier between.
  expect("a write after an unsynchronized ldmatrix", checked(1, 64, 256), [] {
    unsigned char* s = cleave::dynamic_smem();
    if (threadIdx.x == 37) cleave::st_shared<uint32_t>(s + 20, 7u);
    if (threadIdx.x < 32) {
      uint32_t r[4];
      cleave::ldmatrix_x4(r, s + 16 * (threadIdx.x % 16));
    }
  }, {"thread (37,0,0)", "race (write-after-read) at byte 20", "read it at line"});
  // A second block reuses the shared memory: nothing of the first block counts.
  clean("blocks do not race with each other", checked(3, 32, 64), [] {
    unsigned char* s = cleave::dynamic_smem();
    if (threadIdx.x == blockIdx.x) cleave::st_shared<float>(s, 1.0f);
  });
}

struct alignas(16) Row {
  unsigned char b[16];
};

void cp_async_hazards() {
  static Row src[64];
  for (int i = 0; i < 64; ++i) std::memset(src[i].b, i + 1, 16);
  // The issuing thread reads its destination before waiting.
  expect("read before the wait", checked(1, 32, 512), [] {
    unsigned char* s = cleave::dynamic_smem();
    cleave::cp_async_16(s + 16 * threadIdx.x, src[threadIdx.x].b, 16);
    cleave::cp_async_commit();
    (void)cleave::ld_shared<float>(s + 16 * threadIdx.x);
  }, {"cp.async hazard", "this thread's cp_async_16"});
  // Another thread reads it after the issuer's wait but before a barrier. Threads run in order,
  // so thread 1 reads what thread 0's completed copy wrote.
  expect("read after the wait, before the barrier", checked(1, 64, 1024), [] {
    unsigned char* s = cleave::dynamic_smem();
    cleave::cp_async_16(s + 16 * threadIdx.x, src[threadIdx.x].b, 16);
    cleave::cp_async_commit();
    cleave::cp_async_wait<0>();
    (void)cleave::ld_shared<float>(s + 16 * ((threadIdx.x + 63) % 64));
  }, {"thread (1,0,0)", "race (read-after-write) at byte 0", "thread (0,0,0) wrote it"});
  // Another thread reads while the copy may still be in flight: a barrier is not a wait.
  expect("read of another thread's pending copy", checked(1, 64, 1024), [] {
    unsigned char* s = cleave::dynamic_smem();
    if (threadIdx.x == 0) {
      cleave::cp_async_16(s, src[0].b, 16);
      cleave::cp_async_commit();
    }
    __syncthreads();
    if (threadIdx.x == 9) (void)cleave::ld_shared<uint32_t>(s + 4);
    __syncthreads();
    if (threadIdx.x == 0) cleave::cp_async_wait<0>();
  }, {"thread (9,0,0)", "cp.async hazard", "thread (0,0,0) issued"});
  // A prefetch into a tile that other threads read in the same interval.
  expect("prefetch over a tile still being read", checked(1, 64, 1024), [] {
    unsigned char* s = cleave::dynamic_smem();
    (void)cleave::ld_shared<float>(s + 16 * ((threadIdx.x + 5) % 64));
    cleave::cp_async_16(s + 16 * threadIdx.x, src[threadIdx.x].b, 16);
    cleave::cp_async_commit();
    cleave::cp_async_wait<0>();
  }, {"race (write-after-read)"});
  // The correct pattern: issue, commit, wait, barrier, read anywhere; then a barrier before the
  // next copy into the same place.
  clean("copy, wait, barrier, read", checked(1, 64, 1024), [] {
    unsigned char* s = cleave::dynamic_smem();
    for (int round = 0; round < 3; ++round) {
      cleave::cp_async_16(s + 16 * threadIdx.x, src[(threadIdx.x + round) % 64].b, 16);
      cleave::cp_async_commit();
      cleave::cp_async_wait<0>();
      __syncthreads();
      (void)cleave::ld_shared<float>(s + 16 * ((threadIdx.x + 7) % 64));
      __syncthreads();
    }
  });
}

void divergence() {
  // Two shuffles at different call sites: on divergent paths, not one collective.
  expect("shuffles at different sites", checked(1, 32, 0), [] {
    float v = 1.0f;
    if (threadIdx.x < 16) {
      v = __shfl_xor_sync(0xffffffffu, v, 1);
    } else {
      v = __shfl_xor_sync(0xffffffffu, v, 1);
    }
    (void)v;
  }, {"divergence hazard", "__shfl_xor_sync at line"});
  // One call site reached a different number of times by different lanes.
  expect("a shuffle in a lane-dependent loop", checked(1, 32, 0), [] {
    float v = 1.0f;
    for (unsigned i = 0; i < 1 + (threadIdx.x & 1); ++i) v = cleave::quad_sum(v);
    v = cleave::warp_sum(v);
  }, {"divergence hazard"});
  expect("barriers at different sites", checked(1, 64, 0), [] {
    if (threadIdx.x < 32) {
      __syncthreads();
    } else {
      __syncthreads();
    }
  }, {"barrier divergence hazard"});
}

void bounds() {
  static float data[40];
  static float out[8];
  static cleave_emu_buffer bufs[2] = {{data, sizeof data, "x"}, {out, sizeof out, "y"}};
  auto with_buffers = [](cleave_emu_launch L) {
    L.buffers = bufs;
    L.nbuffers = 2;
    return L;
  };
  clean("in-bounds accesses", with_buffers(checked(1, 32, 0)), [] {
    float v = cleave::ld_global(data, 39 - threadIdx.x);
    if (threadIdx.x < 8) cleave::st_global(out, threadIdx.x, v);
  });
  expect("a load one past the end", with_buffers(checked(1, 32, 0)), [] {
    (void)cleave::ld_global(data, threadIdx.x + 9);
  }, {"thread (31,0,0)", "out of bounds: global load", "bytes 160..163 of `x`, which has 160 bytes"});
  expect("a store below the start", with_buffers(checked(1, 32, 0)), [] {
    if (threadIdx.x == 4) cleave::st_global(out, -1, 1.0f);
  }, {"out of bounds: global store", "`y`"});
  // A masked-off copy reads nothing, but its address must still point into its buffer.
  expect("a zero-byte copy from outside", with_buffers(checked(1, 32, 512)), [] {
    unsigned char* s = cleave::dynamic_smem();
    cleave::cp_async_16(s + 16 * threadIdx.x, data + 4 * (threadIdx.x + 8), threadIdx.x < 2 ? 16 : 0);
    cleave::cp_async_commit();
    cleave::cp_async_wait<0>();
  }, {"out of bounds: cp_async_16 source", "past the end of `x`"});
  // Views of one allocation: `lo` ends where `hi` starts. A copy from `hi`'s first row is in
  // bounds, though its address is also one past `lo`'s end; a load through `lo`'s pointer at
  // the same address is not, because the pointer it came from names `lo`.
  static float joined[16];
  static cleave_emu_buffer views[2] = {{joined, 32, "lo"}, {joined + 8, 32, "hi"}};
  auto with_views = [](cleave_emu_launch L) {
    L.buffers = views;
    L.nbuffers = 2;
    return L;
  };
  clean("a copy from the second of two adjacent views", with_views(checked(1, 32, 64)), [] {
    if (threadIdx.x == 0) cleave::cp_async_16(cleave::dynamic_smem(), joined + 8, 16);
    cleave::cp_async_commit();
    cleave::cp_async_wait<0>();
  });
  expect("a load past the first view through its own pointer", with_views(checked(1, 32, 0)), [] {
    if (threadIdx.x == 0) (void)cleave::ld_global(joined, 8);
  }, {"out of bounds: global load", "bytes 32..35 of `lo`"});
  expect("shared memory past the end", checked(1, 32, 64), [] {
    (void)cleave::ld_shared<float>(cleave::dynamic_smem() + 62);
  }, {"out of bounds: shared-memory load", "64 bytes of shared memory"});
}

// A block reduction through shared memory and a butterfly, run under each schedule and several
// seeds, gives bit-identical results: the schedule may only expose bugs, never change a correct
// kernel's output.
void schedules() {
  std::vector<float> in(4 * 256);
  test::Rng rng(9);
  for (float& v : in) v = rng.uniform() * 100.0f;
  std::vector<float> first;
  for (uint32_t schedule : {CLEAVE_EMU_SCHEDULE_ROUND_ROBIN, CLEAVE_EMU_SCHEDULE_RANDOM,
                            CLEAVE_EMU_SCHEDULE_RUN_AHEAD}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      std::vector<float> out(4, 0.0f);
      int rc = test::run(checked(4, 256, 1024, schedule, seed), [&] {
        unsigned char* s = cleave::dynamic_smem();
        unsigned t = threadIdx.x;
        float v = cleave::warp_sum(in[blockIdx.x * 256 + t]);
        if ((t & 31) == 0) cleave::st_shared<float>(s + 4 * (t / 32), v);
        __syncthreads();
        if (t < 32) {
          float w = t < 8 ? cleave::ld_shared<float>(s + 4 * t) : 0.0f;
          w = cleave::warp_sum(w);
          if (t == 0) out[blockIdx.x] = w;
        }
      });
      CHECK(rc == 0, "schedule %u seed %llu: launch failed", schedule, (unsigned long long)seed);
      if (first.empty()) first = out;
      CHECK(std::memcmp(out.data(), first.data(), 4 * sizeof(float)) == 0,
            "schedule %u seed %llu changed the result", schedule, (unsigned long long)seed);
    }
  }
  // Run-ahead lets one warp run to its end before another starts (the last-woken thread runs
  // first, so here warp 1 goes first); round-robin interleaves the warps at every collective.
  for (uint32_t schedule : {CLEAVE_EMU_SCHEDULE_RUN_AHEAD, CLEAVE_EMU_SCHEDULE_ROUND_ROBIN}) {
    std::vector<int> order;
    int rc = test::run(checked(1, 64, 0, schedule), [&] {
      if ((threadIdx.x & 31) == 0) order.push_back(int(threadIdx.x));
      (void)cleave::warp_sum(1.0f);
      if ((threadIdx.x & 31) == 0) order.push_back(int(threadIdx.x));
    });
    CHECK(rc == 0 && order.size() == 4, "schedule %u: launch failed", schedule);
    std::vector<int> want = schedule == CLEAVE_EMU_SCHEDULE_RUN_AHEAD ? std::vector<int>{32, 32, 0, 0}
                                                                       : std::vector<int>{0, 32, 0, 32};
    CHECK(order == want, "schedule %u ran lane 0 of the warps in the order %d %d %d %d", schedule, order[0],
          order[1], order[2], order[3]);
  }
}

// With the random schedule a copy lands at a seeded moment between issue and wait: without the
// checks, a read before the wait sees the new data for some seeds and the old for others.
void random_landing() {
  static Row src[32];
  for (int i = 0; i < 32; ++i) std::memset(src[i].b, 0x3C, 16);
  int landed = 0, stale = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    cleave_emu_launch L = test::config(1, 32, 512, seed);
    L.schedule = CLEAVE_EMU_SCHEDULE_RANDOM;
    unsigned char seen = 0;
    int rc = test::run(L, [&] {
      unsigned char* s = cleave::dynamic_smem();
      cleave::cp_async_16(s + 16 * threadIdx.x, src[threadIdx.x].b, 16);
      cleave::cp_async_commit();
      if (threadIdx.x == 0) seen = s[0];  // the deliberate bug: no wait
      cleave::cp_async_wait<0>();
    });
    CHECK(rc == 0, "random landing seed %llu failed", (unsigned long long)seed);
    (seen == 0x3C ? landed : stale) += 1;
  }
  CHECK(landed > 0 && stale > 0, "copies landed early in %d of 16 runs", landed);
}

}  // namespace

int main() {
  races();
  cp_async_hazards();
  divergence();
  bounds();
  schedules();
  random_landing();
  return test::finish("races");
}
