// Cooperative user-space contexts for the CPU emulator: one per emulated CUDA thread.
//
// A context is a stack plus the callee-saved register state of a suspended computation.
// `ctx_jump(from, to)` saves the running computation into `from` and resumes `to`; it returns
// when some other context jumps back to `from`. Nothing is preemptive, so every switch happens
// at a call the compiler already treats as clobbering memory and caller-saved registers.
//
// On x86-64 (System V) and AArch64 the switch is about twenty instructions of assembly that
// save only what the ABI requires a callee to preserve. Elsewhere, or when CLEAVE_EMU_UCONTEXT is
// defined (which lets the fallback be tested on any machine), POSIX makecontext/swapcontext is
// used; it is correct everywhere but costs a signal-mask system call per switch.
#pragma once

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#if !defined(CLEAVE_EMU_UCONTEXT) && !(defined(__x86_64__) || defined(__aarch64__))
#define CLEAVE_EMU_UCONTEXT 1
#endif

#if defined(CLEAVE_EMU_UCONTEXT)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define CLEAVE_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CLEAVE_EMU_ASAN 1
#endif
#endif
#if defined(CLEAVE_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#pragma GCC visibility push(hidden)

namespace cleave {
namespace emu {
namespace detail {

// A fiber's entry point: it receives the argument given to ctx_init and must never return
// (a finished fiber jumps to another context instead).
using EntryFn = void (*)(void*);

}  // namespace detail
}  // namespace emu
}  // namespace cleave

#if !defined(CLEAVE_EMU_UCONTEXT)

// The switch lives in top-level assembly so that no compiler-generated prologue can touch the
// stack between saving and restoring the stack pointer. The header may be included by many
// translation units of one library, so the symbols are weak (one copy survives linking) and
// hidden (each shared object keeps its own, and calls stay direct).
#if defined(__APPLE__)
#define CLEAVE_EMU_SYM(name) "_" #name
#define CLEAVE_EMU_ASM_HEADER(name)                                                          \
  ".globl " CLEAVE_EMU_SYM(name) "\n.weak_definition " CLEAVE_EMU_SYM(name)                 \
  "\n.private_extern " CLEAVE_EMU_SYM(name) "\n.p2align 4\n" CLEAVE_EMU_SYM(name) ":\n"
#define CLEAVE_EMU_ASM_FOOTER(name) ""
#else
#define CLEAVE_EMU_SYM(name) #name
#define CLEAVE_EMU_ASM_HEADER(name)                                                          \
  ".weak " #name "\n.hidden " #name "\n.type " #name ", %function\n.p2align 4\n" #name ":\n"
#define CLEAVE_EMU_ASM_FOOTER(name) ".size " #name ", .-" #name "\n"
#endif

extern "C" {
// Saves the callee-saved state on the current stack, stores the stack pointer in *save_sp,
// then loads to_sp and restores the state found there.
__attribute__((visibility("hidden"))) void cleave_emu_switch(void** save_sp, void* to_sp);
// First code a new fiber runs: calls entry(arg) with the two values ctx_init left in
// callee-saved registers.
__attribute__((visibility("hidden"))) void cleave_emu_fiber_start();
}

#if defined(__x86_64__)
// Frame layout, from the saved stack pointer up: MXCSR and the x87 control word (both
// callee-saved control state in the System V ABI), r15, r14, r13, r12, rbx, rbp, return address.
__asm__(
    ".text\n" CLEAVE_EMU_ASM_HEADER(cleave_emu_switch)
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  subq $8, %rsp\n"
    "  stmxcsr (%rsp)\n"
    "  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n"
    "  fldcw 4(%rsp)\n"
    "  addq $8, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n" CLEAVE_EMU_ASM_FOOTER(cleave_emu_switch)
    CLEAVE_EMU_ASM_HEADER(cleave_emu_fiber_start)
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n" CLEAVE_EMU_ASM_FOOTER(cleave_emu_fiber_start));
#elif defined(__aarch64__)
// Frame layout, from the saved stack pointer up: x19..x28, x29 (frame pointer), x30 (return
// address), d8..d15 (the low halves of v8..v15 are callee-saved in AAPCS64).
__asm__(
    ".text\n" CLEAVE_EMU_ASM_HEADER(cleave_emu_switch)
    "  sub sp, sp, #160\n"
    "  stp x19, x20, [sp, #0]\n"
    "  stp x21, x22, [sp, #16]\n"
    "  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n"
    "  stp x27, x28, [sp, #64]\n"
    "  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n"
    "  stp d10, d11, [sp, #112]\n"
    "  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x9, sp\n"
    "  str x9, [x0]\n"
    "  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n"
    "  ldp x21, x22, [sp, #16]\n"
    "  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n"
    "  ldp x27, x28, [sp, #64]\n"
    "  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n"
    "  ldp d10, d11, [sp, #112]\n"
    "  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #160\n"
    "  ret\n" CLEAVE_EMU_ASM_FOOTER(cleave_emu_switch)
    CLEAVE_EMU_ASM_HEADER(cleave_emu_fiber_start)
    "  mov x0, x19\n"
    "  blr x20\n"
    "  brk #0\n" CLEAVE_EMU_ASM_FOOTER(cleave_emu_fiber_start));
#endif

namespace cleave {
namespace emu {
namespace detail {

struct RawContext {
  void* sp = nullptr;
};

// Builds the frame that cleave_emu_switch expects at the top of a fresh stack, so that the
// first switch into it "returns" into cleave_emu_fiber_start with entry and arg in place.
inline void raw_init(RawContext& c, unsigned char* stack_lo, size_t size, EntryFn entry,
                     void* arg) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack_lo) + size) & ~uintptr_t(15);
#if defined(__x86_64__)
  // Eight slots: after the final `ret` pops the last one the stack pointer is 16-byte aligned,
  // which is what the `call` in cleave_emu_fiber_start needs to give entry an ABI-aligned frame.
  uint64_t* f = reinterpret_cast<uint64_t*>(top) - 8;
  uint32_t mxcsr;
  uint16_t fpucw;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fpucw));
  f[0] = uint64_t(mxcsr) | (uint64_t(fpucw) << 32);
  f[1] = 0;                                     // r15
  f[2] = 0;                                     // r14
  f[3] = reinterpret_cast<uint64_t>(entry);     // r13
  f[4] = reinterpret_cast<uint64_t>(arg);       // r12
  f[5] = 0;                                     // rbx
  f[6] = 0;                                     // rbp: a zero frame pointer ends backtraces
  f[7] = reinterpret_cast<uint64_t>(&cleave_emu_fiber_start);
#else
  uint64_t* f = reinterpret_cast<uint64_t*>(top) - 20;
  for (int i = 0; i < 20; ++i) f[i] = 0;
  f[0] = reinterpret_cast<uint64_t>(arg);       // x19
  f[1] = reinterpret_cast<uint64_t>(entry);     // x20
  f[11] = reinterpret_cast<uint64_t>(&cleave_emu_fiber_start);  // x30
#endif
  c.sp = f;
}

inline void raw_switch(RawContext& from, RawContext& to) { cleave_emu_switch(&from.sp, to.sp); }

}  // namespace detail
}  // namespace emu
}  // namespace cleave

#else  // CLEAVE_EMU_UCONTEXT

namespace cleave {
namespace emu {
namespace detail {

struct RawContext {
  ucontext_t uc;
};

// makecontext passes only int arguments, so the entry and its argument travel as 32-bit halves.
inline void ctx_trampoline(unsigned e_lo, unsigned e_hi, unsigned a_lo, unsigned a_hi) {
  auto entry = reinterpret_cast<EntryFn>(uintptr_t((uint64_t(e_hi) << 32) | e_lo));
  entry(reinterpret_cast<void*>(uintptr_t((uint64_t(a_hi) << 32) | a_lo)));
  std::abort();
}

inline void raw_init(RawContext& c, unsigned char* stack_lo, size_t size, EntryFn entry,
                     void* arg) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack_lo;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  uintptr_t e = reinterpret_cast<uintptr_t>(entry), a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&c.uc, reinterpret_cast<void (*)()>(&ctx_trampoline), 4, unsigned(e),
              unsigned(uint64_t(e) >> 32), unsigned(a), unsigned(uint64_t(a) >> 32));
}

inline void raw_switch(RawContext& from, RawContext& to) { swapcontext(&from.uc, &to.uc); }

}  // namespace detail
}  // namespace emu
}  // namespace cleave

#endif  // CLEAVE_EMU_UCONTEXT

namespace cleave {
namespace emu {
namespace detail {

// A suspended computation: the architecture's saved state plus the bounds of its stack, which
// AddressSanitizer needs to be told about at every switch (stacks are reused, so without that it
// would report the leftovers of earlier frames as overflows).
struct Context {
  RawContext raw;
  const void* stack_lo = nullptr;
  size_t stack_size = 0;
};

inline void ctx_init(Context& c, unsigned char* stack_lo, size_t size, EntryFn entry, void* arg) {
  c.stack_lo = stack_lo;
  c.stack_size = size;
#if defined(CLEAVE_EMU_ASAN)
  __asan_unpoison_memory_region(stack_lo, size);
#endif
  raw_init(c.raw, stack_lo, size, entry, arg);
}

// Describes the calling OS thread's own stack as the context `c`, for contexts that are
// entered by switching back to that thread's original computation.
inline void ctx_init_current(Context& c) {
#if defined(CLEAVE_EMU_ASAN) && defined(__linux__)
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    void* lo = nullptr;
    size_t size = 0;
    pthread_attr_getstack(&attr, &lo, &size);
    c.stack_lo = lo;
    c.stack_size = size;
    pthread_attr_destroy(&attr);
  }
#else
  (void)c;
#endif
}

// Switches from the running context (saved into `from`) to `to`. `from_done` says that `from`
// will never be resumed, which lets AddressSanitizer drop its bookkeeping for it.
inline void ctx_jump(Context& from, Context& to, bool from_done = false) {
#if defined(CLEAVE_EMU_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(from_done ? nullptr : &fake_stack, to.stack_lo, to.stack_size);
  raw_switch(from.raw, to.raw);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
  (void)from_done;
  raw_switch(from.raw, to.raw);
#endif
}

// The first thing a fiber's entry function does: completes the switch that started it.
inline void ctx_started() {
#if defined(CLEAVE_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
}

// Holds a pthread mutex for one scope. The emulator uses pthreads directly rather than
// <thread> and <mutex>, which would add noticeably to the compile time of every kernel.
class Lock {
 public:
  explicit Lock(pthread_mutex_t& m) : m_(m) { pthread_mutex_lock(&m_); }
  ~Lock() { pthread_mutex_unlock(&m_); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  pthread_mutex_t& m_;
};

// A fiber stack: `size` usable bytes starting at `lo`, with an inaccessible guard page below
// so that an overflow faults instead of silently corrupting the neighbouring stack.
struct Stack {
  unsigned char* lo = nullptr;
  size_t size = 0;
};

// Stacks are mapped once and handed back here after every launch, so a process that launches
// many kernels touches each stack's pages once (the mapping is lazy: untouched pages cost no
// memory). Each emulated library has its own pool, and a process may load and unload hundreds
// of them (a test that emulates many generated kernels), so the pool unmaps its stacks when
// the library is unloaded: kept, they would pile up until the process ran out of mappings.
class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  ~StackPool() {
    size_t page = size_t(sysconf(_SC_PAGESIZE));
    for (const Stack& s : free_) munmap(s.lo - page, s.size + page);
  }

  Stack get(size_t size) {
    {
      Lock lock(mu_);
      for (size_t i = free_.size(); i-- > 0;) {
        if (free_[i].size == size) {
          Stack s = free_[i];
          free_[i] = free_.back();
          free_.pop_back();
          return s;
        }
      }
    }
    size_t page = size_t(sysconf(_SC_PAGESIZE));
    void* map = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (map == MAP_FAILED) return Stack{};
    mprotect(map, page, PROT_NONE);
    return Stack{static_cast<unsigned char*>(map) + page, size};
  }

  void put(const Stack& s) {
    Lock lock(mu_);
    free_.push_back(s);
  }

 private:
  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
  std::vector<Stack> free_;
};

inline StackPool& stack_pool() {
  static StackPool pool;
  return pool;
}

}  // namespace detail
}  // namespace emu
}  // namespace cleave

#pragma GCC visibility pop
