// CPU emulation of the CUDA subset that Cleave's generated kernels use.
//
// The same kernel source that nvcc compiles for the GPU compiles here as plain C++17, so a
// kernel's results can be checked on a machine without a GPU. `cleave/tile.cuh` includes this
// header when it is not compiled by nvcc (or when CLEAVE_EMULATE is defined).
//
// Semantics
// ---------
// * Launch. `cleave::emu::launch(L, body)` runs `body()` once for every thread of every block of
//   the grid described by `L`. Blocks run in an order shuffled by `L->seed` (splitmix64 +
//   Fisher-Yates) on worker OS threads (env CLEAVE_EMU_THREADS, default: the number of online
//   CPUs); each worker runs one block at a time. Blocks must not communicate, so results
//   are identical for any seed and any number of workers. The return value is 0, or non-zero
//   after a NUL-terminated message naming the block and thread has been written to `L->err`.
// * Threads. Each CUDA thread is a fiber with its own stack (env CLEAVE_EMU_STACK bytes, with an
//   optional K or M suffix, default 64K; a guard page below it turns an overflow into a
//   crash). A block's fibers run round-robin on one OS thread; a fiber runs until it blocks at
//   a barrier or a warp collective, or returns. `threadIdx`, `blockIdx`, `blockDim`, `gridDim`
//   and `cleave::dynamic_smem()` resolve to the running fiber and block.
// * `__syncthreads()` is a barrier for the whole block; threads that have returned count as
//   arrived.
// * Warp collectives (`mma_*`, `ldmatrix_*`, `__shfl_*`, `quad_*`, `warp_*`) block until all 32
//   lanes of the warp arrive at the same collective, then compute what the hardware computes
//   and release the lanes. They need a full warp (the block size must be a multiple of 32),
//   and the shuffles emulate only the full mask 0xffffffff.
// * `mma` multiplies the exact f16/bf16 inputs, adds them and C in double precision and rounds
//   once to f32. The tensor cores' internal accumulation order is unspecified, so a GPU result
//   may differ from the emulator's in the last few bits. `quad_*` and `warp_*` replay the
//   device's xor butterflies, so they match bit for bit; `fast_exp2` is `exp2f` with the
//   device's flush of subnormal results to zero, within about 2 ulp of `ex2.approx.ftz`.
// * `cp_async_16` is asynchronous as on hardware: the copy joins the calling thread's open
//   group, `cp_async_commit()` closes the group, and `cp_async_wait<N>()` completes every copy
//   except those of the N most recently committed groups (and of the open group). Until then
//   a copy may land at any moment: at issue, at any later switch of its thread (both drawn
//   from the block's seeded generator), or at the wait. Copies still pending when a thread
//   returns complete then. Bytes past `src_bytes` are zero-filled, and `src_bytes == 0` never
//   reads global memory.
// * Schedules (`L->schedule`). A block's runnable threads are taken round-robin
//   (CLEAVE_EMU_SCHEDULE_ROUND_ROBIN), in a seeded random order (..._RANDOM), or last-woken
//   first (..._RUN_AHEAD), which lets one warp run as far as it can before the others move.
// * Race and hazard checks (`L->checks & CLEAVE_EMU_CHECK_RACES`), in the manner of
//   compute-sanitizer's racecheck: every shared-memory byte remembers its last write and its
//   reads since the last `__syncthreads()`. A read of a byte another thread wrote, or a write
//   of a byte another thread read or wrote, with no barrier in between, is a race. A copy's
//   destination is written when it is issued and again when its wait completes it; any access
//   to it in between (by any thread) is a cp.async hazard. Warp collectives are matched by
//   call site and by how many collectives each lane has run, and barriers by call site and
//   count, so a collective or barrier in divergent code is a divergence hazard. Messages name
//   the block, both threads, the shared-memory offset and the source lines.
// * Bounds checks (`L->checks & CLEAVE_EMU_CHECK_BOUNDS`, with the buffers of the launch in
//   `L->buffers`): every global access of a generated kernel, a cp.async source (even one
//   that copies nothing) and a 16-byte vector access must lie inside the buffer its address
//   points into; every shared-memory access inside the block's dynamic shared memory.
// * Dynamic shared memory is a per-block buffer of `L->smem_bytes` bytes, 128-byte aligned and
//   filled with 0xA5 at the start of every block, so a kernel that reads shared memory it never
//   wrote produces visibly wrong results.
// * Emulation errors: the checks above, a lane that returns while warp-mates wait at a
//   collective, a lane that reaches a collective after a warp-mate returned, a partial warp or
//   a non-full shuffle mask at a collective, a `cp_async_16` or `ldmatrix` address outside the
//   shared buffer or not 16-byte aligned, an unaligned `cp_async_16` source or `st_global_16`
//   / `ld_global_16` operand, and a deadlock (no runnable thread while some are blocked). Each
//   one abandons the block (objects on its fibers' stacks are not destroyed) and fails the
//   launch. The primitives take the caller's source line (`__builtin_LINE()`), which the
//   messages quote.
// * Kernels must not throw: an exception cannot unwind across a fiber's stack boundary.
// * The fiber switches are annotated for AddressSanitizer, so a kernel compiled with
//   -fsanitize=address gets its out-of-bounds global accesses reported at the kernel's line.
#pragma once

#include <math.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "emu_context.h"
#include "emu_numeric.h"

extern "C" {
// One global buffer of a launch, for the bounds checks.
typedef struct cleave_emu_buffer {
  const void* base;
  uint64_t bytes;
  const char* name;  // NUL-terminated
} cleave_emu_buffer;

// `checks` bits and `schedule` values of a launch.
#define CLEAVE_EMU_CHECK_RACES 1u
#define CLEAVE_EMU_CHECK_BOUNDS 2u
#define CLEAVE_EMU_SCHEDULE_ROUND_ROBIN 0u
#define CLEAVE_EMU_SCHEDULE_RANDOM 1u
#define CLEAVE_EMU_SCHEDULE_RUN_AHEAD 2u

// The launch description shared with the Rust runtime. Keep the layout in sync with it. Fields
// after `err_len` may be left zero: no checks, round-robin, no buffers.
typedef struct cleave_emu_launch {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t smem_bytes;
  uint64_t seed;
  char* err;      // on failure, a NUL-terminated message is written here
  size_t err_len;
  const cleave_emu_buffer* buffers;
  uint32_t nbuffers;
  uint32_t checks;
  uint32_t schedule;
} cleave_emu_launch;
}

// The emulator's functions and variables stay inside the shared object that includes them:
// libraries of kernels built at different times can then be loaded side by side (and unloaded)
// without binding to each other's copies. Types are left visible, since GCC would otherwise
// hide every function whose signature mentions them, including the kernels' `extern "C"` entry
// points.
#pragma GCC visibility push(hidden)

// CUDA declaration keywords have no meaning on the CPU. `__restrict__` is already a GCC and
// Clang keyword.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

// CUDA's device math library has rsqrtf; the C library does not.
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

namespace cleave {
namespace emu {
namespace detail {

// Which warp collective a lane is waiting at; lanes of one warp must all reach the same one.
enum class Op : uint8_t {
  None,
  MmaF16,
  MmaBf16,
  MmaTf32,
  LdsmX4,
  LdsmX4Trans,
  LdsmX2,
  LdsmX2Trans,
  ShflXor,
  ShflIdx,
  QuadMax,
  QuadSum,
  WarpMax,
  WarpSum,
};

inline const char* op_name(Op op) {
  switch (op) {
    case Op::None: return "nothing";
    case Op::MmaF16: return "mma_m16n8k16";
    case Op::MmaBf16: return "mma_m16n8k16_bf16";
    case Op::MmaTf32: return "mma_m16n8k8_tf32";
    case Op::LdsmX4: return "ldmatrix_x4";
    case Op::LdsmX4Trans: return "ldmatrix_x4_trans";
    case Op::LdsmX2: return "ldmatrix_x2";
    case Op::LdsmX2Trans: return "ldmatrix_x2_trans";
    case Op::ShflXor: return "__shfl_xor_sync";
    case Op::ShflIdx: return "__shfl_sync";
    case Op::QuadMax: return "quad_max";
    case Op::QuadSum: return "quad_sum";
    case Op::WarpMax: return "warp_max";
    case Op::WarpSum: return "warp_sum";
  }
  return "?";
}

enum class Wait : uint8_t { Ready, Barrier, Collective, Exited };

// A bounded error message built by printf-style appends; long messages are cut, never
// reallocated.
struct Message {
  char text[1024];
  size_t len;

  void clear() {
    len = 0;
    text[0] = '\0';
  }
  __attribute__((format(printf, 2, 0))) void vadd(const char* fmt, va_list ap) {
    int n = vsnprintf(text + len, sizeof text - len, fmt, ap);
    if (n > 0) len = len + size_t(n) < sizeof text ? len + size_t(n) : sizeof text - 1;
  }
  __attribute__((format(printf, 2, 3))) void add(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vadd(fmt, ap);
    va_end(ap);
  }
};

// One deferred cp.async: performed when the thread waits for `group` (or returns).
struct CpCopy {
  unsigned char* dst;
  const unsigned char* src;
  // Bytes read from `src`; the rest of the `size` copied (4 or 16) is zero-filled.
  uint32_t bytes;
  uint32_t size;
  uint64_t group;
  // The source line of the issue, and whether the data has landed already.
  uint32_t line;
  bool landed;
};

// What one shared-memory byte remembers for the race checks: its last write and its reads in
// the current barrier interval (epoch). Epochs grow across the blocks of a worker, so an entry
// left by an earlier block never matches the current one and nothing is cleared per block.
struct Shadow {
  uint32_t w_epoch, w_line, r_epoch, r_line;
  uint16_t w_thread, r_thread;
  // 1 + the thread whose cp.async to this byte has not completed; 0 when none.
  uint16_t pending;
  // More than one thread read the byte in r_epoch.
  uint8_t r_many;
};

struct Fiber {
  Context ctx;
  Stack stack;
  uint3 tid;
  uint32_t index, lane, warp;
  Wait wait;
  // Pending copies in issue order (so in group order); those before cp_head are done.
  std::vector<CpCopy> cp;
  size_t cp_head;
  // Groups committed so far; the open group's id is this count.
  uint64_t cp_committed;
  // Warp collectives and barriers this thread has passed, to match lanes and threads.
  uint64_t coll_seq, barrier_seq;
};

// The rendezvous of one warp's lanes at a collective: each arriving lane leaves its operands
// here, and the last one computes everybody's results.
struct WarpState {
  Op op;
  // The call site and collective count of the first lane to arrive; the others must match.
  uint32_t line;
  uint64_t seq;
  uint32_t arrived, exited, lanes;
  const void* in0[32];
  const void* in1[32];
  const void* in2[32];
  void* out[32];
  uint32_t val[32], arg[32], res[32];
};

// Everything one OS worker thread needs to run blocks; `tl_worker` points at it while it runs.
struct Worker {
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  // Ring buffer of runnable fibers, in the order they became runnable.
  std::vector<uint32_t> ready;
  uint32_t ready_head, ready_len;
  Context main;
  Fiber* cur;
  uint32_t nthreads, exited, at_barrier;
  std::vector<unsigned char> smem_storage;
  unsigned char* smem;
  size_t smem_bytes;
  uint3 block_idx;
  dim3 block_dim, grid_dim;
  EntryFn body;
  void* body_ctx;
  bool failed;
  Message error;
  uint64_t switches;
  // The launch's checks, schedule, buffers, and the generator of the block's choices.
  uint32_t checks, schedule;
  const cleave_emu_buffer* buffers;
  uint32_t nbuffers;
  uint64_t seed, rng;
  // The race checks: one entry per shared-memory byte, and the current barrier interval.
  std::vector<Shadow> shadow;
  uint32_t epoch;
  // The call site and count of the barrier the waiting threads are at.
  uint32_t barrier_line;
  uint64_t barrier_seq;
};

inline thread_local Worker* tl_worker = nullptr;

inline std::atomic<uint64_t>& switch_total() {
  static std::atomic<uint64_t> total{0};
  return total;
}

// Records an emulation error against thread `who` and abandons the block: control goes back to
// the worker, and no fiber of this block ever resumes.
[[noreturn]] inline void fail_at(Worker& w, const Fiber& who, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
inline void fail_at(Worker& w, const Fiber& who, const char* fmt, ...) {
  w.failed = true;
  w.error.clear();
  w.error.add("cleave emu: block (%u,%u,%u) thread (%u,%u,%u): ", w.block_idx.x, w.block_idx.y,
              w.block_idx.z, who.tid.x, who.tid.y, who.tid.z);
  va_list ap;
  va_start(ap, fmt);
  w.error.vadd(fmt, ap);
  va_end(ap);
  ctx_jump(w.cur->ctx, w.main, true);
  std::abort();
}

// Explains a deadlock: which threads wait at the barrier and, per warp, which collective is
// incomplete and which lane is missing from it.
[[noreturn]] inline void deadlock(Worker& w) {
  Message& msg = w.error;
  msg.clear();
  msg.add("cleave emu: deadlock in block (%u,%u,%u): no thread can run;", w.block_idx.x,
          w.block_idx.y, w.block_idx.z);
  if (w.at_barrier) {
    for (const Fiber& f : w.fibers) {
      if (f.wait == Wait::Barrier) {
        msg.add(" %u threads wait at __syncthreads (first: thread (%u,%u,%u));", w.at_barrier,
                f.tid.x, f.tid.y, f.tid.z);
        break;
      }
    }
  }
  for (size_t wi = 0; wi < w.warps.size(); ++wi) {
    const WarpState& ws = w.warps[wi];
    if (!ws.arrived) continue;
    msg.add(" warp %zu: %u of 32 lanes wait at %s", wi, ws.arrived, op_name(ws.op));
    for (uint32_t l = 0; l < ws.lanes; ++l) {
      const Fiber& f = w.fibers[wi * 32 + l];
      if (f.wait != Wait::Collective) {
        msg.add(", but thread (%u,%u,%u) %s", f.tid.x, f.tid.y, f.tid.z,
                f.wait == Wait::Barrier ? "waits at __syncthreads" : "has exited");
        break;
      }
    }
    msg.add(";");
  }
  w.failed = true;
  ctx_jump(w.cur->ctx, w.main, true);
  std::abort();
}

inline void push_ready(Worker& w, uint32_t i) {
  uint32_t slot = w.ready_head + w.ready_len++;
  w.ready[slot >= w.nthreads ? slot - w.nthreads : slot] = i;
}

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The next thread to run, by the launch's schedule.
inline uint32_t pop_ready(Worker& w) {
  auto at = [&](uint32_t k) -> uint32_t& {
    uint32_t slot = w.ready_head + k;
    return w.ready[slot >= w.nthreads ? slot - w.nthreads : slot];
  };
  if (w.schedule == CLEAVE_EMU_SCHEDULE_RANDOM && w.ready_len > 1) {
    uint32_t k = uint32_t(splitmix64(w.rng) % w.ready_len);
    uint32_t t = at(0);
    at(0) = at(k);
    at(k) = t;
  } else if (w.schedule == CLEAVE_EMU_SCHEDULE_RUN_AHEAD) {
    // Last woken first: the lanes a collective just released keep running.
    --w.ready_len;
    return at(w.ready_len);
  }
  uint32_t i = w.ready[w.ready_head];
  if (++w.ready_head == w.nthreads) w.ready_head = 0;
  --w.ready_len;
  return i;
}

inline void land(CpCopy& c) {
  if (!c.landed) {
    if (c.bytes) std::memcpy(c.dst, c.src, c.bytes);
    std::memset(c.dst + c.bytes, 0, c.size - c.bytes);
    c.landed = true;
  }
}

// Lets some of the running thread's pending copies land now, as the hardware may.
inline void land_some(Worker& w, Fiber& f) {
  if (w.schedule != CLEAVE_EMU_SCHEDULE_RANDOM) return;
  for (size_t i = f.cp_head; i < f.cp.size(); ++i) {
    if (!f.cp[i].landed && (splitmix64(w.rng) & 3) == 0) land(f.cp[i]);
  }
}

// Blocks the running fiber (its `wait` is already set) and switches straight to the next
// runnable one; returns when something has made this fiber runnable again and it is its turn.
// `done` marks a fiber that has returned and is left for good.
inline void suspend(Worker& w, bool done = false) {
  if (w.ready_len == 0) deadlock(w);
  Fiber& from = *w.cur;
  land_some(w, from);
  Fiber& to = w.fibers[pop_ready(w)];
  w.cur = &to;
  ++w.switches;
  ctx_jump(from.ctx, to.ctx, done);
}

inline void release_barrier(Worker& w) {
  for (Fiber& f : w.fibers) {
    if (f.wait == Wait::Barrier) {
      f.wait = Wait::Ready;
      push_ready(w, f.index);
    }
  }
  w.at_barrier = 0;
  // A new barrier interval: nothing before it races with anything after it.
  ++w.epoch;
}

inline bool checking_races(const Worker& w) { return (w.checks & CLEAVE_EMU_CHECK_RACES) != 0; }

inline uint32_t smem_offset(const Worker& w, const void* p) {
  return uint32_t(reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(w.smem));
}

// Fails with a race between the running thread and `other` at shared byte `off`. With
// `several`, more threads than `other` made the earlier access, and `other` may be this one.
[[noreturn]] inline void race(Worker& w, const Fiber& me, const char* kind, uint32_t off, const char* mine,
                              uint32_t my_line, const char* theirs, uint32_t other, uint32_t other_line,
                              bool several) {
  const uint3 o = w.fibers[other].tid;
  if (several && other == me.index) {
    fail_at(w, me,
            "shared-memory race (%s) at byte %u of shared memory: this thread %s it at line %u, "
            "and other threads %s it (last at line %u) with no __syncthreads in between",
            kind, off, mine, my_line, theirs, other_line);
  }
  fail_at(w, me,
          "shared-memory race (%s) at byte %u of shared memory: this thread %s it at line %u, "
          "and thread (%u,%u,%u)%s %s it at line %u, with no __syncthreads in between",
          kind, off, mine, my_line, o.x, o.y, o.z, several ? " (and others)" : "", theirs, other_line);
}

[[noreturn]] inline void pending_hazard(Worker& w, const Fiber& me, uint32_t off, bool write, uint32_t line,
                                        const Shadow& s) {
  const Fiber& owner = w.fibers[s.pending - 1u];
  const char* access = write ? "writes" : "reads";
  if (&owner == &me) {
    fail_at(w, me,
            "cp.async hazard at byte %u of shared memory: line %u %s the destination of this thread's "
            "cp_async_16 or cp_async_4 from line %u before a cp_async_wait has completed it",
            off, line, access, s.w_line);
  }
  fail_at(w, me,
          "cp.async hazard at byte %u of shared memory: line %u %s the destination of the "
          "cp_async_16 or cp_async_4 thread (%u,%u,%u) issued at line %u, which that thread has not waited for "
          "(a cp_async_wait and a __syncthreads must come between)",
          off, line, access, owner.tid.x, owner.tid.y, owner.tid.z, s.w_line);
}

// Records an access of `n` shared-memory bytes at `p` (already checked to lie in shared
// memory) by thread `me` at `line`, and fails on a race or a cp.async hazard.
inline void shadow_access(Worker& w, const Fiber& me, const void* p, size_t n, bool write, uint32_t line) {
  const uint16_t t = uint16_t(me.index);
  const uint32_t e = w.epoch;
  const uint32_t base = smem_offset(w, p);
  for (uint32_t off = base; off < base + n; ++off) {
    Shadow& s = w.shadow[off];
    if (s.pending) pending_hazard(w, me, off, write, line, s);
    if (write) {
      if (s.w_epoch == e && s.w_thread != t) {
        race(w, me, "write-after-write", off, "writes", line, "wrote", s.w_thread, s.w_line, false);
      }
      if (s.r_epoch == e && (s.r_thread != t || s.r_many)) {
        // With several readers one of them differs from this thread; name the recorded one
        // when it is another thread.
        race(w, me, "write-after-read", off, "writes", line, "read", s.r_thread, s.r_line, s.r_many);
      }
      s.w_epoch = e;
      s.w_thread = t;
      s.w_line = line;
    } else {
      if (s.w_epoch == e && s.w_thread != t) {
        race(w, me, "read-after-write", off, "reads", line, "wrote", s.w_thread, s.w_line, false);
      }
      if (s.r_epoch != e) {
        s.r_epoch = e;
        s.r_thread = t;
        s.r_line = line;
        s.r_many = 0;
      } else if (s.r_thread != t) {
        s.r_many = 1;
      }
    }
  }
}

// A copy is complete: its data is in place and, for the checks, its thread wrote it now.
inline void complete_copy(Worker& w, Fiber& f, CpCopy& c) {
  land(c);
  if (!checking_races(w)) return;
  const uint32_t base = smem_offset(w, c.dst);
  for (uint32_t off = base; off < base + c.size; ++off) {
    Shadow& s = w.shadow[off];
    s.pending = 0;
    s.w_epoch = w.epoch;
    s.w_thread = uint16_t(f.index);
    s.w_line = c.line;
  }
}

// Completes, in issue order, the pending copies of every group older than the `keep` most
// recently committed ones.
inline void cp_drain(Worker& w, Fiber& f, uint64_t keep) {
  while (f.cp_head < f.cp.size() && f.cp[f.cp_head].group + keep < f.cp_committed) {
    complete_copy(w, f, f.cp[f.cp_head++]);
  }
  if (f.cp_head == f.cp.size()) {
    f.cp.clear();
    f.cp_head = 0;
  }
}

inline void thread_exit(Worker& w) {
  Fiber& f = *w.cur;
  for (size_t i = f.cp_head; i < f.cp.size(); ++i) complete_copy(w, f, f.cp[i]);
  f.wait = Wait::Exited;
  ++w.exited;
  WarpState& ws = w.warps[f.warp];
  ++ws.exited;
  if (ws.arrived) {
    fail_at(w, f, "thread exited while %u lanes of its warp wait at %s", ws.arrived,
            op_name(ws.op));
  }
  if (w.at_barrier && w.at_barrier + w.exited == w.nthreads) release_barrier(w);
  if (w.exited == w.nthreads) ctx_jump(f.ctx, w.main, true);
  suspend(w, true);
  std::abort();  // an exited fiber is never made runnable again
}

inline void fiber_entry(void* p) {
  ctx_started();
  Worker& w = *static_cast<Worker*>(p);
  w.body(w.body_ctx);
  thread_exit(w);
}

// Fails unless `n` bytes at `p` lie in the block's shared memory and `p` is aligned to `align`.
inline void check_smem(Worker& w, const Fiber& who, const void* p, size_t n, size_t align, const char* what,
                       uint32_t line) {
  auto a = reinterpret_cast<uintptr_t>(p), lo = reinterpret_cast<uintptr_t>(w.smem);
  if (a < lo || a + n > lo + w.smem_bytes) {
    fail_at(w, who, "out of bounds: %s at line %u: %zu bytes at %p are outside the block's %zu bytes of shared memory at %p",
            what, line, n, p, w.smem_bytes, static_cast<void*>(w.smem));
  }
  if (a % align) fail_at(w, who, "alignment hazard: %s at line %u: %p is not %zu-byte aligned", what, line, p, align);
}

inline bool in_smem(const Worker& w, const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p), lo = reinterpret_cast<uintptr_t>(w.smem);
  return a >= lo && a < lo + w.smem_bytes;
}

// Fails unless `n` bytes at `p` lie inside the launch buffer that `base` points into (when
// bounds are checked and the launch named its buffers). `index` is the element index the
// kernel used, for the message.
inline void check_global(Worker& w, const void* base, const void* p, size_t n, const char* what, uint32_t line) {
  if (!(w.checks & CLEAVE_EMU_CHECK_BOUNDS) || w.nbuffers == 0) return;
  auto b = reinterpret_cast<uintptr_t>(base), a = reinterpret_cast<uintptr_t>(p);
  // A buffer's end counts as inside it, so that a pointer one past the last element (or the
  // base of an empty buffer) still names the buffer it came from. Buffers may be adjacent
  // (views of one allocation, such as q, k and v cut from one qkv tensor), so a base at one
  // buffer's end and the next one's start names whichever holds the access.
  const cleave_emu_buffer* named = nullptr;
  for (uint32_t i = 0; i < w.nbuffers; ++i) {
    const cleave_emu_buffer& buf = w.buffers[i];
    auto lo = reinterpret_cast<uintptr_t>(buf.base), hi = lo + buf.bytes;
    if (b < lo || b > hi) continue;
    if (a >= lo && a + n <= hi) return;
    if (!named) named = &buf;
  }
  if (named) {
    auto lo = reinterpret_cast<uintptr_t>(named->base);
    fail_at(w, *w.cur, "out of bounds: %s at line %u touches bytes %lld..%lld of `%s`, which has %llu bytes", what,
            line, (long long)(a - lo), (long long)(a - lo + n) - 1, named->name ? named->name : "?",
            (unsigned long long)named->bytes);
  }
  // No buffer holds the address: name the nearest one that starts below it.
  const cleave_emu_buffer* near = nullptr;
  for (uint32_t i = 0; i < w.nbuffers; ++i) {
    auto lo = reinterpret_cast<uintptr_t>(w.buffers[i].base);
    if (lo <= b && (!near || lo > reinterpret_cast<uintptr_t>(near->base))) near = &w.buffers[i];
  }
  if (near) {
    auto lo = reinterpret_cast<uintptr_t>(near->base);
    fail_at(w, *w.cur, "out of bounds: %s at line %u uses an address %llu bytes past the end of `%s` (%llu bytes)",
            what, line, (unsigned long long)(b - lo - near->bytes), near->name ? near->name : "?",
            (unsigned long long)near->bytes);
  }
  fail_at(w, *w.cur, "out of bounds: %s at line %u uses the address %p, below every buffer of the launch", what,
          line, base);
}

// The accumulator layout every product shares: lane l holds (g, 2t), (g, 2t+1), (g+8, 2t),
// (g+8, 2t+1) with g = l / 4, t = l % 4.
inline void write_mma_d(WarpState& ws, const float (&D)[16][8]) {
  for (uint32_t l = 0; l < 32; ++l) {
    uint32_t g = l >> 2, t2 = (l & 3) * 2;
    float* d = static_cast<float*>(ws.out[l]);
    d[0] = D[g][t2];
    d[1] = D[g][t2 + 1];
    d[2] = D[g + 8][t2];
    d[3] = D[g + 8][t2 + 1];
  }
}

template <float (*Cvt)(uint16_t)>
inline void compute_mma(WarpState& ws) {
  float A[16][16], B[16][8], C[16][8];
  for (uint32_t l = 0; l < 32; ++l) {
    uint32_t g = l >> 2, t2 = (l & 3) * 2;
    const uint32_t* a = static_cast<const uint32_t*>(ws.in0[l]);
    const uint32_t* b = static_cast<const uint32_t*>(ws.in1[l]);
    const float* c = static_cast<const float*>(ws.in2[l]);
    // A register holds (low half, high half) = (column 2t, column 2t+1) of one row.
    const uint32_t arow[4] = {g, g + 8, g, g + 8}, acol[4] = {t2, t2, t2 + 8, t2 + 8};
    for (int r = 0; r < 4; ++r) {
      A[arow[r]][acol[r]] = Cvt(uint16_t(a[r]));
      A[arow[r]][acol[r] + 1] = Cvt(uint16_t(a[r] >> 16));
    }
    // B registers hold (low, high) = (k 2t, k 2t+1) and (k 2t+8, k 2t+9) of column g.
    B[t2][g] = Cvt(uint16_t(b[0]));
    B[t2 + 1][g] = Cvt(uint16_t(b[0] >> 16));
    B[t2 + 8][g] = Cvt(uint16_t(b[1]));
    B[t2 + 9][g] = Cvt(uint16_t(b[1] >> 16));
    C[g][t2] = c[0];
    C[g][t2 + 1] = c[1];
    C[g + 8][t2] = c[2];
    C[g + 8][t2 + 1] = c[3];
  }
  // Every input is read before any output is written: d may alias c. Products of two 16-bit
  // floats are exact in double, and each sum runs in a fixed order (C first, then k = 0..15),
  // so the result does not depend on the host's vector width or on FMA contraction. The loop
  // nest keeps 8 independent sums in flight instead of one long dependency chain.
  double Bd[16][8];
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < 8; ++j) Bd[k][j] = B[k][j];
  float D[16][8];
  for (int i = 0; i < 16; ++i) {
    double acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = C[i][j];
    for (int k = 0; k < 16; ++k) {
      double a = A[i][k];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] += a * Bd[k][j];
    }
    for (int j = 0; j < 8; ++j) D[i][j] = float(acc[j]);
  }
  write_mma_d(ws, D);
}

// The tf32 product m16n8k8. The tensor cores read only the upper 19 bits of a tf32 operand,
// so the lower 13 are dropped here too. Products of two tf32 values are exact in double, and
// the sums run in a fixed order, as in `compute_mma`.
inline void compute_mma_tf32(WarpState& ws) {
  double A[16][8], B[8][8];
  float C[16][8];
  const auto tf32 = [](uint32_t u) { return double(bits_f32(u & 0xffffe000u)); };
  for (uint32_t l = 0; l < 32; ++l) {
    uint32_t g = l >> 2, t = l & 3, t2 = t * 2;
    const uint32_t* a = static_cast<const uint32_t*>(ws.in0[l]);
    const uint32_t* b = static_cast<const uint32_t*>(ws.in1[l]);
    const float* c = static_cast<const float*>(ws.in2[l]);
    A[g][t] = tf32(a[0]);
    A[g + 8][t] = tf32(a[1]);
    A[g][t + 4] = tf32(a[2]);
    A[g + 8][t + 4] = tf32(a[3]);
    B[t][g] = tf32(b[0]);
    B[t + 4][g] = tf32(b[1]);
    C[g][t2] = c[0];
    C[g][t2 + 1] = c[1];
    C[g + 8][t2] = c[2];
    C[g + 8][t2 + 1] = c[3];
  }
  float D[16][8];
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      double acc = C[i][j];
      for (int k = 0; k < 8; ++k) acc += A[i][k] * B[k][j];
      D[i][j] = float(acc);
    }
  }
  write_mma_d(ws, D);
}

inline void compute_ldmatrix(Worker& w, uint32_t warp, WarpState& ws, int nmat, bool trans) {
  uint16_t m[4][8][8];
  for (int i = 0; i < nmat; ++i) {
    for (int r = 0; r < 8; ++r) {
      uint32_t lane = uint32_t(8 * i + r);
      const Fiber& f = w.fibers[warp * 32 + lane];
      check_smem(w, f, ws.in0[lane], 16, 16, "ldmatrix row address", ws.line);
      if (checking_races(w)) shadow_access(w, f, ws.in0[lane], 16, false, ws.line);
      std::memcpy(m[i][r], ws.in0[lane], 16);
    }
  }
  for (uint32_t l = 0; l < 32; ++l) {
    uint32_t g = l >> 2, t2 = (l & 3) * 2;
    uint32_t* out = static_cast<uint32_t*>(ws.out[l]);
    for (int i = 0; i < nmat; ++i) {
      uint16_t lo = trans ? m[i][t2][g] : m[i][g][t2];
      uint16_t hi = trans ? m[i][t2 + 1][g] : m[i][g][t2 + 1];
      out[i] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
}

// Replays the xor-butterfly that the device code runs (`v = op(v, shfl_xor(v, s))` for each
// step s in order), so results match the GPU bit for bit.
template <int NSteps>
inline void compute_butterfly(WarpState& ws, const int (&steps)[NSteps], bool is_max) {
  float v[32], nv[32];
  for (int l = 0; l < 32; ++l) v[l] = bits_f32(ws.val[l]);
  for (int s : steps) {
    for (int l = 0; l < 32; ++l) nv[l] = is_max ? fmaxf(v[l], v[l ^ s]) : v[l] + v[l ^ s];
    std::memcpy(v, nv, sizeof v);
  }
  for (int l = 0; l < 32; ++l) ws.res[l] = f32_bits(v[l]);
}

inline void compute(Worker& w, uint32_t warp, WarpState& ws) {
  static constexpr int kQuad[2] = {1, 2};
  static constexpr int kWarp[5] = {16, 8, 4, 2, 1};
  switch (ws.op) {
    case Op::MmaF16: compute_mma<f16_bits_to_f32>(ws); break;
    case Op::MmaBf16: compute_mma<bf16_bits_to_f32>(ws); break;
    case Op::MmaTf32: compute_mma_tf32(ws); break;
    case Op::LdsmX4: compute_ldmatrix(w, warp, ws, 4, false); break;
    case Op::LdsmX4Trans: compute_ldmatrix(w, warp, ws, 4, true); break;
    case Op::LdsmX2: compute_ldmatrix(w, warp, ws, 2, false); break;
    case Op::LdsmX2Trans: compute_ldmatrix(w, warp, ws, 2, true); break;
    // shfl.sync uses the low five bits of the lane operand, so for a whole warp every index
    // is in range.
    case Op::ShflXor:
      for (uint32_t l = 0; l < 32; ++l) ws.res[l] = ws.val[l ^ (ws.arg[l] & 31)];
      break;
    case Op::ShflIdx:
      for (uint32_t l = 0; l < 32; ++l) ws.res[l] = ws.val[ws.arg[l] & 31];
      break;
    case Op::QuadMax: compute_butterfly(ws, kQuad, true); break;
    case Op::QuadSum: compute_butterfly(ws, kQuad, false); break;
    case Op::WarpMax: compute_butterfly(ws, kWarp, true); break;
    case Op::WarpSum: compute_butterfly(ws, kWarp, false); break;
    case Op::None: break;
  }
}

// Arrives at a warp collective with this lane's operands; returns once the collective has
// completed for the whole warp. The result of a 32-bit collective is in res[lane].
inline WarpState& collective(Op op, uint32_t line, const void* in0, const void* in1, const void* in2, void* out,
                             uint32_t val = 0, uint32_t arg = 0) {
  Worker& w = *tl_worker;
  Fiber& f = *w.cur;
  WarpState& ws = w.warps[f.warp];
  if (ws.lanes != 32) {
    fail_at(w, f,
            "%s needs a full warp, but this warp has %u threads (make the block size a "
            "multiple of 32)",
            op_name(op), ws.lanes);
  }
  if (ws.exited) {
    fail_at(w, f, "divergence hazard: reached %s at line %u after %u lanes of its warp exited", op_name(op), line,
            ws.exited);
  }
  if (ws.arrived == 0) {
    ws.op = op;
    ws.line = line;
    ws.seq = f.coll_seq;
  } else if (ws.op != op || ws.line != line || ws.seq != f.coll_seq) {
    // Every lane must run the same collective instruction: the same call site, reached after
    // the same number of collectives (a collective in divergent code fails one of the two).
    fail_at(w, f,
            "divergence hazard: reached %s at line %u (its collective #%llu) while %u lanes of its "
            "warp wait at %s at line %u (their collective #%llu)",
            op_name(op), line, (unsigned long long)f.coll_seq, ws.arrived, op_name(ws.op), ws.line,
            (unsigned long long)ws.seq);
  }
  ++f.coll_seq;
  uint32_t l = f.lane;
  ws.in0[l] = in0;
  ws.in1[l] = in1;
  ws.in2[l] = in2;
  ws.out[l] = out;
  ws.val[l] = val;
  ws.arg[l] = arg;
  if (++ws.arrived < 32) {
    f.wait = Wait::Collective;
    suspend(w);
    return ws;
  }
  compute(w, f.warp, ws);
  ws.arrived = 0;
  ws.op = Op::None;
  for (uint32_t i = f.warp * 32, end = i + 32; i < end; ++i) {
    if (i != f.index) {
      w.fibers[i].wait = Wait::Ready;
      push_ready(w, i);
    }
  }
  return ws;
}

inline uint32_t shuffle(Op op, unsigned mask, uint32_t v, int arg, uint32_t line) {
  if (mask != 0xffffffffu) {
    Worker& w = *tl_worker;
    fail_at(w, *w.cur, "%s with mask 0x%08x at line %u: the emulator supports only the full mask", op_name(op),
            mask, line);
  }
  Fiber& f = *tl_worker->cur;
  return collective(op, line, nullptr, nullptr, nullptr, nullptr, v, uint32_t(arg)).res[f.lane];
}

inline float reduce(Op op, float v, uint32_t line) {
  Fiber& f = *tl_worker->cur;
  return bits_f32(collective(op, line, nullptr, nullptr, nullptr, nullptr, f32_bits(v)).res[f.lane]);
}

inline void syncthreads(uint32_t line) {
  Worker& w = *tl_worker;
  Fiber& f = *w.cur;
  if (w.at_barrier == 0) {
    w.barrier_line = line;
    w.barrier_seq = f.barrier_seq;
  } else if (w.barrier_line != line || w.barrier_seq != f.barrier_seq) {
    // One barrier instruction for the whole block: a barrier in divergent code fails here.
    fail_at(w, f,
            "barrier divergence hazard: reached __syncthreads at line %u (its barrier #%llu) while %u "
            "threads wait at the one at line %u (their barrier #%llu)",
            line, (unsigned long long)f.barrier_seq, w.at_barrier, w.barrier_line,
            (unsigned long long)w.barrier_seq);
  }
  ++f.barrier_seq;
  if (w.at_barrier + 1 + w.exited == w.nthreads) {
    release_barrier(w);
    return;
  }
  ++w.at_barrier;
  f.wait = Wait::Barrier;
  suspend(w);
}

// A `size`-byte asynchronous copy (`cp_async_16` or `cp_async_4`): both addresses aligned to
// `size`, at most `size` bytes read and the rest zero-filled.
inline void cp_async(void* dst, const void* src, int src_bytes, uint32_t size, uint32_t line) {
  Worker& w = *tl_worker;
  Fiber& f = *w.cur;
  if (src_bytes < 0 || uint32_t(src_bytes) > size) {
    fail_at(w, f, "cp_async_%u at line %u with src_bytes %d (must be 0..%u)", size, line, src_bytes, size);
  }
  const bool narrow = size == 4;
  check_smem(w, f, dst, size, size, narrow ? "cp_async_4 destination" : "cp_async_16 destination", line);
  if (src_bytes && reinterpret_cast<uintptr_t>(src) % size) {
    fail_at(w, f, "alignment hazard: cp_async_%u source %p at line %u is not %u-byte aligned", size, src, line,
            size);
  }
  // The source must point into its buffer even when nothing is read from it.
  check_global(w, src, src, size_t(src_bytes), narrow ? "cp_async_4 source" : "cp_async_16 source", line);
  if (checking_races(w)) {
    // The copy may land at once: it writes its destination now, and stays pending until the
    // wait that completes it.
    shadow_access(w, f, dst, size, true, line);
    const uint32_t base = smem_offset(w, dst);
    for (uint32_t off = base; off < base + size; ++off) w.shadow[off].pending = uint16_t(f.index + 1);
  }
  f.cp.push_back(CpCopy{static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src),
                        uint32_t(src_bytes), size, f.cp_committed, line, false});
  if (w.schedule == CLEAVE_EMU_SCHEDULE_RANDOM && (splitmix64(w.rng) & 1)) land(f.cp.back());
}

inline void check_aligned(const void* p, const char* what, uint32_t line) {
  if (reinterpret_cast<uintptr_t>(p) % 16) {
    Worker& w = *tl_worker;
    fail_at(w, *w.cur, "alignment hazard: %s %p at line %u is not 16-byte aligned", what, p, line);
  }
}

// A scalar or vector access of shared memory by the running thread.
inline void smem_access(const void* p, size_t n, bool write, uint32_t line) {
  Worker& w = *tl_worker;
  check_smem(w, *w.cur, p, n, 1, write ? "shared-memory store" : "shared-memory load", line);
  if (checking_races(w)) shadow_access(w, *w.cur, p, n, write, line);
}

inline const uint3& thread_idx() { return tl_worker->cur->tid; }
inline const uint3& block_idx() { return tl_worker->block_idx; }
inline const dim3& block_dim() { return tl_worker->block_dim; }
inline const dim3& grid_dim() { return tl_worker->grid_dim; }

// Reads a positive size from the environment, accepting a K or M suffix; anything else
// (unset, empty, zero, garbage) gives `fallback`.
inline size_t env_size(const char* name, size_t fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (*end == 'k' || *end == 'K') {
    v <<= 10;
    ++end;
  } else if (*end == 'm' || *end == 'M') {
    v <<= 20;
    ++end;
  }
  return (v == 0 || *end) ? fallback : size_t(v);
}

struct LaunchState {
  const cleave_emu_launch* L;
  EntryFn body;
  void* body_ctx;
  std::vector<uint32_t> order;
  size_t stack_bytes;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  bool failed = false;
  uint64_t failed_pos = 0;
  Message error;
};

inline void record_error(LaunchState& s, uint64_t pos, const Message& msg) {
  Lock lock(s.mu);
  // Of several failing blocks, report the one earliest in the launch order, so that a
  // single-worker run and a parallel one usually name the same block.
  if (!s.failed || pos < s.failed_pos) {
    s.failed = true;
    s.failed_pos = pos;
    s.error = msg;
  }
  s.stop = true;
}

inline void run_block(Worker& w, uint32_t linear) {
  uint32_t gx = w.grid_dim.x, gy = w.grid_dim.y;
  w.block_idx = uint3{linear % gx, (linear / gx) % gy, linear / (gx * gy)};
  std::memset(w.smem, 0xA5, w.smem_bytes);
  // The block's choices depend on the seed and the block, never on which worker runs it.
  w.rng = w.seed ^ (uint64_t(linear) * 0x9e3779b97f4a7c15ull);
  splitmix64(w.rng);
  // A fresh barrier interval; shadow entries of earlier blocks are older, so they never match.
  if (w.epoch > UINT32_MAX - (1u << 24)) {
    std::fill(w.shadow.begin(), w.shadow.end(), Shadow{});
    w.epoch = 0;
  }
  ++w.epoch;
  for (Fiber& f : w.fibers) {
    f.wait = Wait::Ready;
    f.cp.clear();
    f.cp_head = 0;
    f.cp_committed = 0;
    f.coll_seq = 0;
    f.barrier_seq = 0;
    ctx_init(f.ctx, f.stack.lo, f.stack.size, &fiber_entry, &w);
  }
  for (WarpState& ws : w.warps) {
    ws.op = Op::None;
    ws.arrived = 0;
    ws.exited = 0;
  }
  for (uint32_t i = 0; i < w.nthreads; ++i) w.ready[i] = i;
  w.ready_head = 0;
  w.ready_len = w.nthreads;
  w.exited = 0;
  w.at_barrier = 0;
  w.cur = &w.fibers[pop_ready(w)];
  ++w.switches;
  ctx_jump(w.main, w.cur->ctx);
}

inline void worker_main(LaunchState& s) {
  const cleave_emu_launch& L = *s.L;
  Worker w;
  w.nthreads = L.block[0] * L.block[1] * L.block[2];
  w.block_dim = dim3{L.block[0], L.block[1], L.block[2]};
  w.grid_dim = dim3{L.grid[0], L.grid[1], L.grid[2]};
  w.body = s.body;
  w.body_ctx = s.body_ctx;
  w.failed = false;
  w.switches = 0;
  w.checks = L.checks;
  w.schedule = L.schedule;
  w.buffers = L.buffers;
  w.nbuffers = L.buffers ? L.nbuffers : 0;
  w.seed = L.seed;
  w.epoch = 0;
  w.smem_bytes = L.smem_bytes;
  if (w.checks & CLEAVE_EMU_CHECK_RACES) w.shadow.assign(w.smem_bytes, Shadow{});
  w.smem_storage.resize(w.smem_bytes + 128);
  w.smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(w.smem_storage.data()) + 127) & ~uintptr_t(127));
  w.ready.resize(w.nthreads);
  w.fibers.resize(w.nthreads);
  bool stacks_ok = true;
  for (uint32_t i = 0; i < w.nthreads; ++i) {
    Fiber& f = w.fibers[i];
    f.index = i;
    f.tid = uint3{i % L.block[0], (i / L.block[0]) % L.block[1], i / (L.block[0] * L.block[1])};
    f.lane = i % 32;
    f.warp = i / 32;
    f.stack = stack_pool().get(s.stack_bytes);
    stacks_ok = stacks_ok && f.stack.lo;
  }
  w.warps.resize((w.nthreads + 31) / 32);
  for (size_t i = 0; i < w.warps.size(); ++i) {
    size_t left = w.nthreads - 32 * i;
    w.warps[i].lanes = uint32_t(left < 32 ? left : 32);
  }
  ctx_init_current(w.main);
  tl_worker = &w;
  if (!stacks_ok) {
    w.error.clear();
    w.error.add("cleave emu: cannot map %u fiber stacks of %zu bytes", w.nthreads, s.stack_bytes);
    record_error(s, 0, w.error);
  }
  while (stacks_ok && !s.stop.load(std::memory_order_relaxed)) {
    uint64_t pos = s.next.fetch_add(1);
    if (pos >= s.order.size()) break;
    run_block(w, s.order[pos]);
    if (w.failed) {
      record_error(s, pos, w.error);
      break;
    }
  }
  tl_worker = nullptr;
  for (Fiber& f : w.fibers) {
    if (f.stack.lo) stack_pool().put(f.stack);
  }
  switch_total() += w.switches;
}

inline void* worker_thread(void* state) {
  worker_main(*static_cast<LaunchState*>(state));
  return nullptr;
}

inline int launch_impl(const cleave_emu_launch* L, EntryFn body, void* body_ctx) {
  LaunchState s;
  s.L = L;
  s.body = body;
  s.body_ctx = body_ctx;
  s.error.clear();
  uint64_t nblocks = uint64_t(L->grid[0]) * L->grid[1] * L->grid[2];
  uint64_t nthreads = uint64_t(L->block[0]) * L->block[1] * L->block[2];
  if (nblocks == 0 || nblocks > UINT32_MAX || nthreads == 0 || nthreads > 1024) {
    s.failed = true;
    s.error.add("cleave emu: invalid launch: grid (%u,%u,%u), block (%u,%u,%u); the grid must be "
                "non-empty and blocks must have 1..1024 threads",
                L->grid[0], L->grid[1], L->grid[2], L->block[0], L->block[1], L->block[2]);
  } else {
    s.order.resize(nblocks);
    for (uint32_t i = 0; i < nblocks; ++i) s.order[i] = i;
    uint64_t rng = L->seed;
    for (uint64_t i = nblocks - 1; i > 0; --i) {
      uint64_t j = splitmix64(rng) % (i + 1);
      uint32_t t = s.order[i];
      s.order[i] = s.order[j];
      s.order[j] = t;
    }
    size_t page = size_t(sysconf(_SC_PAGESIZE));
    size_t stack = env_size("CLEAVE_EMU_STACK", 64 << 10);
    if (stack < (16 << 10)) stack = 16 << 10;
    s.stack_bytes = (stack + page - 1) / page * page;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t workers = env_size("CLEAVE_EMU_THREADS", cpus > 0 ? size_t(cpus) : 1);
    if (workers > nblocks) workers = nblocks;
    // The calling thread is one of the workers; if a thread cannot be created, the others
    // simply take on its blocks.
    std::vector<pthread_t> threads;
    for (uint64_t i = 1; i < workers; ++i) {
      pthread_t t;
      if (pthread_create(&t, nullptr, &worker_thread, &s) == 0) threads.push_back(t);
    }
    worker_main(s);
    for (pthread_t t : threads) pthread_join(t, nullptr);
  }
  if (!s.failed) return 0;
  if (L->err && L->err_len) {
    size_t n = s.error.len < L->err_len ? s.error.len : L->err_len - 1;
    std::memcpy(L->err, s.error.text, n);
    L->err[n] = '\0';
  }
  return 1;
}

template <class F>
void call_body(void* f) {
  (*static_cast<F*>(f))();
}

}  // namespace detail

// Runs `body()` as every thread of every block of the launch `L` (see the top of this file).
template <class F>
int launch(const cleave_emu_launch* L, F&& body) {
  using Fn = std::remove_reference_t<F>;
  return detail::launch_impl(L, &detail::call_body<Fn>,
                             const_cast<void*>(static_cast<const void*>(&body)));
}

// Fiber switches performed by all launches of this process so far (for speed measurements).
inline uint64_t switch_count() { return detail::switch_total().load(); }

}  // namespace emu
}  // namespace cleave

// CUDA's built-in variables, as expressions that resolve to the running fiber and block.
#define threadIdx (::cleave::emu::detail::thread_idx())
#define blockIdx (::cleave::emu::detail::block_idx())
#define blockDim (::cleave::emu::detail::block_dim())
#define gridDim (::cleave::emu::detail::grid_dim())

// Every primitive below takes the caller's source line as a defaulted last argument, for the
// checks' messages and for matching collectives by call site.
#define CLEAVE_EMU_LINE uint32_t line = __builtin_LINE()

inline void __syncthreads(CLEAVE_EMU_LINE) { ::cleave::emu::detail::syncthreads(line); }
// A product rounded on its own, never fused into a following add (ISO C++ does not contract
// across the call).
inline float __fmul_rn(float a, float b) {
  volatile float p = a * b;
  return p;
}

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask, CLEAVE_EMU_LINE) {
  using namespace ::cleave::emu::detail;
  return bits_f32(shuffle(Op::ShflXor, mask, f32_bits(v), lane_mask, line));
}
inline unsigned __shfl_xor_sync(unsigned mask, unsigned v, int lane_mask, CLEAVE_EMU_LINE) {
  using namespace ::cleave::emu::detail;
  return shuffle(Op::ShflXor, mask, v, lane_mask, line);
}
// Without this overload an int argument would be ambiguous between the float and unsigned ones.
inline int __shfl_xor_sync(unsigned mask, int v, int lane_mask, CLEAVE_EMU_LINE) {
  using namespace ::cleave::emu::detail;
  return int(shuffle(Op::ShflXor, mask, uint32_t(v), lane_mask, line));
}
inline float __shfl_sync(unsigned mask, float v, int src_lane, CLEAVE_EMU_LINE) {
  using namespace ::cleave::emu::detail;
  return bits_f32(shuffle(Op::ShflIdx, mask, f32_bits(v), src_lane, line));
}
inline unsigned __shfl_sync(unsigned mask, unsigned v, int src_lane, CLEAVE_EMU_LINE) {
  using namespace ::cleave::emu::detail;
  return shuffle(Op::ShflIdx, mask, v, src_lane, line);
}
inline int __shfl_sync(unsigned mask, int v, int src_lane, CLEAVE_EMU_LINE) {
  using namespace ::cleave::emu::detail;
  return int(shuffle(Op::ShflIdx, mask, uint32_t(v), src_lane, line));
}

namespace cleave {

inline void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], CLEAVE_EMU_LINE) {
  emu::detail::collective(emu::detail::Op::MmaF16, line, a, b, c, d);
}
inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                              CLEAVE_EMU_LINE) {
  emu::detail::collective(emu::detail::Op::MmaBf16, line, a, b, c, d);
}

inline void mma_m16n8k8_tf32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                             CLEAVE_EMU_LINE) {
  emu::detail::collective(emu::detail::Op::MmaTf32, line, a, b, c, d);
}

inline uint32_t f32_bits(float x) { return emu::detail::f32_bits(x); }
inline float f32_of_bits(uint32_t u) { return emu::detail::bits_f32(u); }

// cvt.rna.tf32.f32: to nearest, ties away from zero; a NaN becomes the canonical one.
inline uint32_t tf32_rna(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffffffu;
  return (u + 0x1000u) & 0xffffe000u;
}

// The device hides v from ptxas's rematerialization; on the host there is nothing to hide.
inline int opaque(int v) { return v; }

inline void ldmatrix_x4(uint32_t r[4], const void* smem_row, CLEAVE_EMU_LINE) {
  emu::detail::collective(emu::detail::Op::LdsmX4, line, smem_row, nullptr, nullptr, r);
}
inline void ldmatrix_x4_trans(uint32_t r[4], const void* smem_row, CLEAVE_EMU_LINE) {
  emu::detail::collective(emu::detail::Op::LdsmX4Trans, line, smem_row, nullptr, nullptr, r);
}
inline void ldmatrix_x2(uint32_t r[2], const void* smem_row, CLEAVE_EMU_LINE) {
  emu::detail::collective(emu::detail::Op::LdsmX2, line, smem_row, nullptr, nullptr, r);
}
inline void ldmatrix_x2_trans(uint32_t r[2], const void* smem_row, CLEAVE_EMU_LINE) {
  emu::detail::collective(emu::detail::Op::LdsmX2Trans, line, smem_row, nullptr, nullptr, r);
}

inline void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes, CLEAVE_EMU_LINE) {
  emu::detail::cp_async(smem_dst, gmem_src, src_bytes, 16, line);
}
inline void cp_async_4(void* smem_dst, const void* gmem_src, int src_bytes, CLEAVE_EMU_LINE) {
  emu::detail::cp_async(smem_dst, gmem_src, src_bytes, 4, line);
}
inline void cp_async_commit() { ++emu::detail::tl_worker->cur->cp_committed; }
template <int N>
inline void cp_async_wait() {
  static_assert(N >= 0, "cp_async_wait<N> needs N >= 0");
  emu::detail::Worker& w = *emu::detail::tl_worker;
  emu::detail::cp_drain(w, *w.cur, uint64_t(N));
}

inline float quad_max(float v, CLEAVE_EMU_LINE) { return emu::detail::reduce(emu::detail::Op::QuadMax, v, line); }
inline float quad_sum(float v, CLEAVE_EMU_LINE) { return emu::detail::reduce(emu::detail::Op::QuadSum, v, line); }
inline float warp_max(float v, CLEAVE_EMU_LINE) { return emu::detail::reduce(emu::detail::Op::WarpMax, v, line); }
inline float warp_sum(float v, CLEAVE_EMU_LINE) { return emu::detail::reduce(emu::detail::Op::WarpSum, v, line); }

// The device's ex2.approx.ftz flushes subnormal results to zero; that is modelled. Its
// approximation error (about 2 ulp) is not: the emulator's exp2f is closer to exact.
inline float fast_exp2(float x) {
  float r = exp2f(x);
  return std::fabs(r) < 1.17549435e-38f ? 0.0f : r;
}

inline uint32_t pack_half2(float lo, float hi) {
  return uint32_t(from_float<half>(lo).bits) | (uint32_t(from_float<half>(hi).bits) << 16);
}
inline uint32_t pack_bf162(float lo, float hi) {
  return uint32_t(from_float<bf16>(lo).bits) | (uint32_t(from_float<bf16>(hi).bits) << 16);
}
inline float2 unpack_half2(uint32_t v) {
  return float2{emu::detail::f16_bits_to_f32(uint16_t(v)),
                emu::detail::f16_bits_to_f32(uint16_t(v >> 16))};
}
inline float2 unpack_bf162(uint32_t v) {
  return float2{emu::detail::bf16_bits_to_f32(uint16_t(v)),
                emu::detail::bf16_bits_to_f32(uint16_t(v >> 16))};
}

// The device's 16-byte vector accesses fault on misaligned addresses; here that is an error.
// The shared-memory side, when there is one, is a checked shared access like any other.
inline void st_global_16(void* gmem, const void* src16, CLEAVE_EMU_LINE) {
  emu::detail::check_aligned(gmem, "st_global_16 destination", line);
  emu::detail::check_aligned(src16, "st_global_16 source", line);
  emu::detail::Worker& w = *emu::detail::tl_worker;
  emu::detail::check_global(w, gmem, gmem, 16, "st_global_16", line);
  if (emu::detail::in_smem(w, src16)) emu::detail::smem_access(src16, 16, false, line);
  std::memcpy(gmem, src16, 16);
}
inline void ld_global_16(void* dst16, const void* gmem, CLEAVE_EMU_LINE) {
  emu::detail::check_aligned(dst16, "ld_global_16 destination", line);
  emu::detail::check_aligned(gmem, "ld_global_16 source", line);
  emu::detail::Worker& w = *emu::detail::tl_worker;
  emu::detail::check_global(w, gmem, gmem, 16, "ld_global_16", line);
  if (emu::detail::in_smem(w, dst16)) emu::detail::smem_access(dst16, 16, true, line);
  std::memcpy(dst16, gmem, 16);
}

// Scalar accesses of generated kernels: shared memory at a byte address, global memory as
// element `i` of the array at `p`.
template <class T>
inline T ld_shared(const void* p, CLEAVE_EMU_LINE) {
  emu::detail::smem_access(p, sizeof(T), false, line);
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
inline void st_shared(void* p, T v, CLEAVE_EMU_LINE) {
  emu::detail::smem_access(p, sizeof(T), true, line);
  std::memcpy(p, &v, sizeof(T));
}
// The address of element `i` of `p`, computed as an integer: an out-of-range `p + i` is what
// the check is there to catch, so it must not be pointer arithmetic.
template <class T>
inline const void* element_address(const T* p, long long i) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + uintptr_t(i) * sizeof(T));
}
template <class T>
inline T ld_global(const T* p, long long i, CLEAVE_EMU_LINE) {
  emu::detail::check_global(*emu::detail::tl_worker, p, element_address(p, i), sizeof(T), "global load", line);
  T v;
  std::memcpy(&v, p + i, sizeof(T));
  return v;
}
template <class T>
inline void st_global(T* p, long long i, T v, CLEAVE_EMU_LINE) {
  emu::detail::check_global(*emu::detail::tl_worker, p, element_address(p, i), sizeof(T), "global store", line);
  std::memcpy(p + i, &v, sizeof(T));
}

inline unsigned char* dynamic_smem() { return emu::detail::tl_worker->smem; }

}  // namespace cleave

#undef CLEAVE_EMU_LINE

#pragma GCC visibility pop
