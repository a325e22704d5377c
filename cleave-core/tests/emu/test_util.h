// Shared helpers for the emulator's C++ test programs: checks that count failures instead of
// stopping at the first, seeded pseudo-random data, and a launch wrapper.
#pragma once

#include <cleave/tile.cuh>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>

namespace test {

inline int& failures() {
  static int n = 0;
  return n;
}

inline int& checks() {
  static int n = 0;
  return n;
}

// Prints the first few failures in detail; the exit status reports all of them.
inline bool check(bool ok, const char* file, int line, const std::string& what) {
  ++checks();
  if (!ok && ++failures() <= 20) std::printf("%s:%d: FAILED: %s\n", file, line, what.c_str());
  return ok;
}

#define CHECK(cond, ...) ::test::check((cond), __FILE__, __LINE__, ::test::msg(__VA_ARGS__))

__attribute__((format(printf, 1, 2))) inline std::string msg(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// Deterministic generator; values are never all zeros, so a kernel that leaves its outputs
// untouched cannot pass.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() { return cleave::emu::detail::splitmix64(s); }
  // Uniform in [-1, 1).
  float uniform() { return float(int64_t(next() >> 40) - (int64_t(1) << 23)) / float(1 << 23); }
};

inline cleave_emu_launch config(unsigned grid, unsigned block, unsigned smem = 0,
                                uint64_t seed = 1) {
  cleave_emu_launch L{};
  L.grid[0] = grid;
  L.grid[1] = L.grid[2] = 1;
  L.block[0] = block;
  L.block[1] = L.block[2] = 1;
  L.smem_bytes = smem;
  L.seed = seed;
  return L;
}

// Runs `body` as the kernel of launch `L`; on failure stores the emulator's message in *err.
template <class F>
int run(cleave_emu_launch L, F&& body, std::string* err = nullptr) {
  char buf[1024] = {0};
  L.err = buf;
  L.err_len = sizeof buf;
  int rc = cleave::emu::launch(&L, body);
  if (err) *err = buf;
  if (rc != 0 && !err) std::printf("unexpected emulation error: %s\n", buf);
  return rc;
}

inline bool close(double got, double want, double rel) {
  return std::fabs(got - want) <= rel * std::fmax(1.0, std::fabs(want));
}

inline int finish(const char* name) {
  std::printf("%s: %d checks, %d failed\n", name, checks(), failures());
  return failures() ? 1 : 0;
}

}  // namespace test
