// cp_async_16 and cp_async_4: zero-fill by src_bytes, deferral until cp_async_wait (reads before the wait see
// old shared memory, as on hardware), group accounting, and the errors for bad operands of it
// and of the 16-byte global loads and stores.
#include "test_util.h"

#include <cstring>
#include <vector>

namespace {

constexpr unsigned char kGarbage = 0xA5;

struct alignas(16) Row {
  unsigned char b[16];
};

std::vector<Row> random_rows(size_t n, uint64_t seed) {
  test::Rng rng(seed);
  std::vector<Row> rows(n);
  for (Row& r : rows)
    for (unsigned char& c : r.b) c = static_cast<unsigned char>(rng.next() % 255 + 1);  // never 0
  return rows;
}

// Lane l copies l % 17 bytes (0..16); the rest of its 16-byte destination must be zero, and
// src_bytes == 0 must not touch the (null) source.
void zero_fill() {
  std::vector<Row> src = random_rows(32, 1);
  std::vector<Row> out(32);
  int rc = test::run(test::config(1, 32, 32 * 16), [&] {
    unsigned l = threadIdx.x;
    int n = int(l % 17);
    unsigned char* dst = cleave::dynamic_smem() + l * 16;
    cleave::cp_async_16(dst, n ? src[l].b : nullptr, n);
    cleave::cp_async_commit();
    cleave::cp_async_wait<0>();
    std::memcpy(out[l].b, dst, 16);
  });
  CHECK(rc == 0, "zero_fill: launch failed");
  for (int l = 0; l < 32; ++l) {
    int n = l % 17;
    for (int i = 0; i < 16; ++i) {
      unsigned char want = i < n ? src[l].b[i] : 0;
      CHECK(out[l].b[i] == want, "zero_fill lane %d (src_bytes %d) byte %d: got %02x want %02x", l,
            n, i, out[l].b[i], want);
    }
  }
}

// A kernel that reads its destination before waiting sees the garbage fill; after the wait it
// sees the data. A second copy to the same place shows the stale first value until its wait.
void deferral() {
  std::vector<Row> x = random_rows(64, 2), y = random_rows(64, 3);
  std::vector<Row> early(64), late(64), stale(64), fresh(64);
  int rc = test::run(test::config(2, 32, 32 * 16), [&] {
    unsigned t = blockIdx.x * 32 + threadIdx.x;
    unsigned char* dst = cleave::dynamic_smem() + threadIdx.x * 16;
    cleave::cp_async_16(dst, x[t].b, 16);
    cleave::cp_async_commit();
    std::memcpy(early[t].b, dst, 16);  // the deliberate bug: no wait before reading
    cleave::cp_async_wait<0>();
    std::memcpy(late[t].b, dst, 16);
    cleave::cp_async_16(dst, y[t].b, 16);
    cleave::cp_async_commit();
    std::memcpy(stale[t].b, dst, 16);
    cleave::cp_async_wait<0>();
    std::memcpy(fresh[t].b, dst, 16);
  });
  CHECK(rc == 0, "deferral: launch failed");
  for (int t = 0; t < 64; ++t) {
    for (int i = 0; i < 16; ++i) {
      CHECK(early[t].b[i] == kGarbage, "thread %d read %02x before the wait, want the garbage fill",
            t, early[t].b[i]);
      CHECK(late[t].b[i] == x[t].b[i], "thread %d: data missing after the wait", t);
      CHECK(stale[t].b[i] == x[t].b[i], "thread %d: second copy visible before its wait", t);
      CHECK(fresh[t].b[i] == y[t].b[i], "thread %d: second copy missing after its wait", t);
    }
  }
}

// Three committed groups to three places: wait<2> completes only the oldest, wait<1> the next,
// wait<0> all. A copy that was never committed is not covered by wait<0>.
void groups() {
  std::vector<Row> src = random_rows(4, 4);
  // seen[step][slot]: whether slot holds its data after each step.
  bool seen[5][4] = {};
  int rc = test::run(test::config(1, 32, 4 * 16), [&] {
    if (threadIdx.x != 0) return;
    unsigned char* s = cleave::dynamic_smem();
    auto snapshot = [&](int step) {
      for (int k = 0; k < 4; ++k) seen[step][k] = std::memcmp(s + 16 * k, src[k].b, 16) == 0;
    };
    for (int k = 0; k < 3; ++k) {
      cleave::cp_async_16(s + 16 * k, src[k].b, 16);
      cleave::cp_async_commit();
    }
    cleave::cp_async_16(s + 48, src[3].b, 16);  // left in the open group
    cleave::cp_async_wait<2>();
    snapshot(0);
    cleave::cp_async_wait<1>();
    snapshot(1);
    cleave::cp_async_wait<0>();
    snapshot(2);
    cleave::cp_async_commit();
    snapshot(3);
    cleave::cp_async_wait<0>();
    snapshot(4);
  });
  CHECK(rc == 0, "groups: launch failed");
  const bool want[5][4] = {{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 1, 0}, {1, 1, 1, 1}};
  for (int step = 0; step < 5; ++step) {
    for (int k = 0; k < 4; ++k) {
      CHECK(seen[step][k] == want[step][k], "groups step %d slot %d: done=%d want %d", step, k,
            seen[step][k], want[step][k]);
    }
  }
}

// Copies still pending when a thread returns are performed then; another thread sees them after
// the barrier that the returned thread counts as having reached.
void pending_at_exit() {
  std::vector<Row> src = random_rows(1, 5);
  Row seen{};
  int rc = test::run(test::config(1, 64, 16), [&] {
    if (threadIdx.x == 0) {
      cleave::cp_async_16(cleave::dynamic_smem(), src[0].b, 16);
      cleave::cp_async_commit();
      return;
    }
    __syncthreads();
    if (threadIdx.x == 63) std::memcpy(seen.b, cleave::dynamic_smem(), 16);
  });
  CHECK(rc == 0, "pending_at_exit: launch failed");
  CHECK(std::memcmp(seen.b, src[0].b, 16) == 0, "copy pending at exit was not performed");
}

// cp_async_4 copies one 4-byte element or, with src_bytes 0, writes a zero and reads nothing;
// like the 16-byte copy it lands only at its wait.
void four_bytes() {
  std::vector<Row> src = random_rows(8, 7);
  const unsigned char* words = src[0].b;  // 128 bytes: 32 words
  unsigned char early[32][4], late[32][4];
  int rc = test::run(test::config(1, 32, 32 * 4), [&] {
    unsigned l = threadIdx.x;
    unsigned char* dst = cleave::dynamic_smem() + 4 * l;
    cleave::cp_async_4(dst, words + 4 * l, l % 3 ? 4 : 0);
    cleave::cp_async_commit();
    std::memcpy(early[l], dst, 4);  // the deliberate bug: no wait before reading
    cleave::cp_async_wait<0>();
    std::memcpy(late[l], dst, 4);
  });
  CHECK(rc == 0, "four_bytes: launch failed");
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i) {
      unsigned char want = l % 3 ? words[4 * l + i] : 0;
      CHECK(early[l][i] == kGarbage, "four_bytes lane %d read %02x before the wait", l, early[l][i]);
      CHECK(late[l][i] == want, "four_bytes lane %d byte %d: got %02x want %02x", l, i, late[l][i], want);
    }
  }
}

void expect_error(const char* name, int bad, const char* needle) {
  std::vector<Row> src = random_rows(2, 6);
  std::string err;
  int rc = test::run(test::config(2, 32, 64), [&] {
    unsigned char* s = cleave::dynamic_smem();
    if (blockIdx.x == 1 && threadIdx.x == 7) {
      switch (bad) {
        case 0: cleave::cp_async_16(s + 64, src[0].b, 16); break;            // past the end
        case 1: cleave::cp_async_16(s + 8, src[0].b, 16); break;             // misaligned dst
        case 2: cleave::cp_async_16(s, src[0].b + 4, 12); break;             // misaligned src
        case 3: cleave::cp_async_16(s, src[0].b, 17); break;                 // src_bytes > 16
        case 4: cleave::cp_async_16(src[1].b, src[0].b, 16); break;          // dst not in smem
        case 5: cleave::st_global_16(src[1].b + 8, s); break;                // misaligned store
        case 7: cleave::cp_async_4(s, src[0].b + 2, 4); break;               // misaligned src
        case 8: cleave::cp_async_4(s + 2, src[0].b, 4); break;               // misaligned dst
        case 9: cleave::cp_async_4(s, src[0].b, 8); break;                   // src_bytes > 4
        default: cleave::ld_global_16(s, src[0].b + 4); break;               // misaligned load
      }
    }
  }, &err);
  CHECK(rc != 0, "%s: launch succeeded", name);
  CHECK(err.find("block (1,0,0) thread (7,0,0)") != std::string::npos &&
            err.find(needle) != std::string::npos,
        "%s: message '%s' lacks the location or '%s'", name, err.c_str(), needle);
}

}  // namespace

int main() {
  zero_fill();
  deferral();
  groups();
  pending_at_exit();
  four_bytes();
  expect_error("out of range", 0, "outside the block's 64 bytes");
  expect_error("misaligned destination", 1, "not 16-byte aligned");
  expect_error("misaligned source", 2, "source");
  expect_error("src_bytes", 3, "src_bytes 17");
  expect_error("global destination", 4, "outside");
  expect_error("st_global_16 alignment", 5, "st_global_16 destination");
  expect_error("ld_global_16 alignment", 6, "ld_global_16 source");
  expect_error("cp_async_4 source alignment", 7, "cp_async_4 source");
  expect_error("cp_async_4 destination alignment", 8, "cp_async_4 destination");
  expect_error("cp_async_4 src_bytes", 9, "src_bytes 8 (must be 0..4)");
  return test::finish("cp_async");
}
