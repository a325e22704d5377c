// The memory-system probe: measures on the GPU what the cost model (cleave-core's arch.rs and
// plan/cost.rs) assumes about streaming from HBM, so that its constants can be set from
// measurements rather than guesses:
//
//   1. peak    the bandwidth of a read-only stream and of a copy with every SM busy
//              (`Arch::dram_bandwidth`);
//   2. sms     the bandwidth of n blocks, one per SM, for n from 8 to every SM, at several
//              amounts of bytes in flight per block: how much one SM streams on its own
//              (`Arch::sm_dram_bandwidth`, a guess of 1.3 times the even share today) and how
//              many SMs saturate HBM;
//   3. grids   a fixed 256 MiB (about one SwiGLU decode step's weights) split evenly over grids
//              of 56 to 1792 blocks of 4 warps: whether a grid one block short of a wave (112
//              blocks on 132 SMs) is slower than two uneven waves (224) or many small blocks,
//              which is the choice the scheduler makes for the decode GEMVs;
//   4. launches what an empty launch costs when queued, and what a dependent second launch
//              (a split's combine) adds after a streaming kernel (`LAUNCH_SECONDS`);
//   5. latency a dependent chain of loads through a buffer larger than L2 (`Arch::dram_latency`
//              is the loaded latency, which this idle figure bounds from below).
//
// Every block streams one contiguous slice with 16-byte loads that bypass L1, `unroll` of them
// in flight per thread; a block that must be alone on its SM asks for more than half the
// SM's shared memory. Times are the median of five CUDA-event measurements of a batch of runs.
//
//   nvcc -O3 -arch=sm_90 -o probe probe.cu && ./probe [--json FILE] [--quick]

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(call)                                                                         \
    do {                                                                                    \
        cudaError_t err_ = (call);                                                          \
        if (err_ != cudaSuccess) {                                                          \
            std::fprintf(stderr, "probe: %s at %s:%d: %s\n", #call, __FILE__, __LINE__,      \
                         cudaGetErrorString(err_));                                         \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)

// Reads `per_block` 16-byte words from the block's slice. The XOR of everything read is
// stored only when it equals a value the fill never produces, so the loads cannot be removed
// and nothing is written.
template <int U>
__global__ void stream_read(const int4* __restrict__ src, size_t per_block, int4* sink) {
    const int4* p = src + blockIdx.x * per_block;
    int4 acc = make_int4(0, 0, 0, 0);
    const size_t step = size_t(blockDim.x) * U;
    for (size_t i = threadIdx.x; i < per_block; i += step) {
        int4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            size_t j = i + size_t(u) * blockDim.x;
            v[u] = j < per_block ? __ldcg(p + j) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            acc.x ^= v[u].x;
            acc.y ^= v[u].y;
            acc.z ^= v[u].z;
            acc.w ^= v[u].w;
        }
    }
    if (acc.x == 0x7f3a5c11 && acc.y == 0x1b2c3d4e && acc.z == acc.w) {
        sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
    }
}

// Copies each block's slice: half the bytes read, half written.
template <int U>
__global__ void stream_copy(const int4* __restrict__ src, int4* __restrict__ dst, size_t per_block) {
    const size_t base = blockIdx.x * per_block;
    const size_t step = size_t(blockDim.x) * U;
    for (size_t i = threadIdx.x; i < per_block; i += step) {
        int4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            size_t j = i + size_t(u) * blockDim.x;
            if (j < per_block) v[u] = __ldcg(src + base + j);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            size_t j = i + size_t(u) * blockDim.x;
            if (j < per_block) __stcg(dst + base + j, v[u]);
        }
    }
}

// One thread follows a chain of indices; each load's address depends on the one before.
__global__ void chase(const uint32_t* __restrict__ next, uint32_t hops, uint32_t* out) {
    uint32_t i = 0;
    for (uint32_t h = 0; h < hops; ++h) i = __ldcg(next + i);
    *out = i;
}

// Does nothing: what a launch costs on its own.
__global__ void empty_kernel() {}

__global__ void fill(uint32_t* p, size_t words) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
        p[i] = uint32_t(i * 2654435761u) | 1u;
    }
}

struct Gpu {
    int sms = 0;
    int smem_per_sm = 0;
    size_t l2 = 0;
    std::string name;
};

using Launch = void (*)(int blocks, int threads, int smem, const int4* src, int4* dst, size_t per_block);

template <int U>
void launch_read(int blocks, int threads, int smem, const int4* src, int4* dst, size_t per_block) {
    stream_read<U><<<blocks, threads, smem>>>(src, per_block, dst);
}

template <int U>
void launch_copy(int blocks, int threads, int smem, const int4* src, int4* dst, size_t per_block) {
    stream_copy<U><<<blocks, threads, smem>>>(src, dst, per_block);
}

void launch_empty(int, int, int, const int4*, int4*, size_t) { empty_kernel<<<1, 32>>>(); }

// A streaming read followed in the same stream by a small kernel of 64 blocks reading 1 MiB,
// as a split decode's combine follows its partials: the difference from the read alone is
// what the second, dependent launch adds (`cost.rs`'s `LAUNCH_SECONDS` charges 4 µs).
template <int U>
void launch_read_then_small(int blocks, int threads, int smem, const int4* src, int4* dst, size_t per_block) {
    stream_read<U><<<blocks, threads, smem>>>(src, per_block, dst);
    stream_read<1><<<64, 128>>>(src, (size_t(1) << 20) / 16 / 64, dst);
}

Launch read_kernel(int unroll) {
    switch (unroll) {
        case 1: return launch_read<1>;
        case 2: return launch_read<2>;
        case 4: return launch_read<4>;
        case 8: return launch_read<8>;
        case 16: return launch_read<16>;
        default: std::fprintf(stderr, "probe: no read kernel for unroll %d\n", unroll); std::exit(2);
    }
}

template <int U>
void allow_smem(int bytes) {
    CHECK(cudaFuncSetAttribute(stream_read<U>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// Seconds per launch: the median of five batches of `reps` launches, after a warm-up launch.
double time_launch(Launch k, int blocks, int threads, int smem, const int4* src, int4* dst, size_t per_block, int reps) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    k(blocks, threads, smem, src, dst, per_block);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) {
        CHECK(cudaEventRecord(a));
        for (int i = 0; i < reps; ++i) k(blocks, threads, smem, src, dst, per_block);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1e-3 / reps);
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[2];
}

struct Json {
    std::string text = "{";
    bool first = true;
    void key(const char* k) {
        text += first ? "\n  \"" : ",\n  \"";
        text += k;
        text += "\": ";
        first = false;
    }
};

int main(int argc, char** argv) {
    const char* json_path = nullptr;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
            json_path = argv[++i];
        } else if (!std::strcmp(argv[i], "--quick")) {
            quick = true;
        } else {
            std::fprintf(stderr, "usage: probe [--json FILE] [--quick]\n");
            return 2;
        }
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        std::fprintf(stderr, "probe: no CUDA device\n");
        return 1;
    }
    Gpu gpu;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    gpu.sms = prop.multiProcessorCount;
    gpu.smem_per_sm = int(prop.sharedMemPerMultiprocessor);
    gpu.l2 = size_t(prop.l2CacheSize);
    gpu.name = prop.name;
    std::printf("# Memory-system probe: %s, %d SMs, %zu MiB L2, %d KiB shared memory per SM\n\n", gpu.name.c_str(),
                gpu.sms, gpu.l2 >> 20, gpu.smem_per_sm >> 10);

    // 2 GiB: forty times the L2, so every pass streams from HBM.
    const size_t bytes = size_t(2) << 30;
    int4* src = nullptr;
    int4* dst = nullptr;
    CHECK(cudaMalloc(&src, bytes));
    CHECK(cudaMalloc(&dst, bytes));
    fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(src), bytes / 4);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    const size_t words = bytes / 16;
    Json json;
    json.key("gpu");
    json.text += "{\"name\": \"" + gpu.name + "\", \"sms\": " + std::to_string(gpu.sms) +
                 ", \"l2_bytes\": " + std::to_string(gpu.l2) + "}";

    // 1. Peak: eight blocks of 256 threads per SM, eight loads in flight per thread.
    {
        const int blocks = gpu.sms * 8;
        const size_t per = words / blocks;
        double tr = time_launch(read_kernel(8), blocks, 256, 0, src, dst, per, 5);
        double tc = time_launch(launch_copy<8>, blocks, 256, 0, src, dst, per / 2, 5);
        double read_bw = double(per * blocks * 16) / tr;
        double copy_bw = double(per / 2 * blocks * 16) * 2 / tc;
        std::printf("## Peak\n\n| stream | GB/s |\n|---|---:|\n| read | %.0f |\n| copy (read + write) | %.0f |\n\n",
                    read_bw / 1e9, copy_bw / 1e9);
        json.key("peak");
        char buf[160];
        std::snprintf(buf, sizeof buf, "{\"read_bytes_per_s\": %.4g, \"copy_bytes_per_s\": %.4g}", read_bw, copy_bw);
        json.text += buf;
    }

    // 2. Busy SMs: n blocks of 128 threads, each alone on its SM (it asks for more than half
    // of an SM's shared memory), each streaming 8 MiB.
    {
        const int smem = gpu.smem_per_sm / 2 + 1024;
        allow_smem<1>(smem);
        allow_smem<2>(smem);
        allow_smem<4>(smem);
        allow_smem<8>(smem);
        allow_smem<16>(smem);
        std::vector<int> ns = {8, 16, 32, 48, 64, 80, 96, 104, 112, 120, 128};
        if (gpu.sms > 128) ns.push_back(gpu.sms);
        std::vector<int> unrolls = quick ? std::vector<int>{4, 16} : std::vector<int>{1, 2, 4, 8, 16};
        std::printf("## Busy SMs: one block of 4 warps per SM, bytes in flight per SM (KiB) across\n\n");
        std::printf("GB/s of the whole GPU (per SM in brackets).\n\n| SMs |");
        for (int u : unrolls) std::printf(" %d KiB |", u * 128 * 16 / 1024);
        std::printf("\n|---:|");
        for (size_t i = 0; i < unrolls.size(); ++i) std::printf("---:|");
        std::printf("\n");
        json.key("busy_sms");
        json.text += "[";
        bool first = true;
        const size_t per = (size_t(8) << 20) / 16;
        for (int n : ns) {
            std::printf("| %d |", n);
            for (int u : unrolls) {
                double t = time_launch(read_kernel(u), n, 128, smem, src, dst, per, 3);
                double bw = double(per * n * 16) / t;
                std::printf(" %.0f (%.1f) |", bw / 1e9, bw / n / 1e9);
                char buf[200];
                std::snprintf(buf, sizeof buf, "%s{\"sms\": %d, \"in_flight_bytes\": %d, \"bytes_per_s\": %.4g}",
                              first ? "" : ", ", n, u * 128 * 16, bw);
                json.text += buf;
                first = false;
            }
            std::printf("\n");
        }
        json.text += "]";
        std::printf("\n");
    }

    // 3. Grids: 256 MiB split evenly over each grid; blocks of 4 warps with 8 KiB in flight,
    // as many resident per SM as fit (no shared memory), and with at most one (as a decode
    // block with a deep pipeline in shared memory would be).
    {
        const size_t total = size_t(256) << 20;
        std::vector<int> grids = {56, 96, 112, 128, gpu.sms, 224, 2 * gpu.sms, 448, 896, 1792};
        std::printf("## Grids: 256 MiB over n blocks of 4 warps\n\n");
        std::printf("| blocks | waves (%d SMs) | µs, many per SM | GB/s | µs, one per SM | GB/s |\n|---:|---:|---:|---:|---:|---:|\n",
                    gpu.sms);
        const int alone = gpu.smem_per_sm / 2 + 1024;
        json.key("grids");
        json.text += "[";
        bool first = true;
        for (int n : grids) {
            const size_t per = total / 16 / n;
            double many = time_launch(read_kernel(4), n, 128, 0, src, dst, per, 10);
            double one = time_launch(read_kernel(4), n, 128, alone, src, dst, per, 10);
            double moved = double(per * n * 16);
            std::printf("| %d | %.2f | %.1f | %.0f | %.1f | %.0f |\n", n, double(n) / gpu.sms, many * 1e6,
                        moved / many / 1e9, one * 1e6, moved / one / 1e9);
            char buf[200];
            std::snprintf(buf, sizeof buf, "%s{\"blocks\": %d, \"seconds_many_per_sm\": %.4g, \"seconds_one_per_sm\": %.4g, \"bytes\": %.0f}",
                          first ? "" : ", ", n, many, one, moved);
            json.text += buf;
            first = false;
        }
        json.text += "]";
        std::printf("\n");
    }

    // 4. Launches: an empty kernel queued back to back, and the cost of a dependent second
    // launch after a 64 MiB read over every SM.
    {
        double empty = time_launch(launch_empty, 1, 32, 0, src, dst, 0, 1000);
        const int blocks = gpu.sms * 4;
        const size_t per = (size_t(64) << 20) / 16 / blocks;
        double alone = time_launch(read_kernel(8), blocks, 256, 0, src, dst, per, 20);
        double pair = time_launch(launch_read_then_small<8>, blocks, 256, 0, src, dst, per, 20);
        std::printf("## Launches\n\n| what | µs |\n|---|---:|\n| an empty kernel, queued back to back | %.2f |\n"
                    "| a 64 MiB read over %d blocks | %.2f |\n| the same, then a 64-block kernel reading 1 MiB | %.2f |\n"
                    "| what the second launch adds | %.2f |\n\n",
                    empty * 1e6, blocks, alone * 1e6, pair * 1e6, (pair - alone) * 1e6);
        json.key("launches");
        char buf[200];
        std::snprintf(buf, sizeof buf, "{\"empty_s\": %.4g, \"read_s\": %.4g, \"read_then_small_s\": %.4g}", empty, alone,
                      pair);
        json.text += buf;
    }

    // 5. Latency: a random cycle through 1 GiB of 32-bit indices, one hop per 4 KiB page at
    // most once, so neither L2 nor a row buffer helps.
    {
        const size_t n = (size_t(1) << 30) / 4;
        const size_t stride = 1024;  // one index per 4 KiB
        const size_t slots = n / stride;
        std::vector<uint32_t> order(slots);
        for (size_t i = 0; i < slots; ++i) order[i] = uint32_t(i);
        uint64_t s = 0x9e3779b97f4a7c15ull;
        for (size_t i = slots - 1; i > 0; --i) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            std::swap(order[i], order[s % (i + 1)]);
        }
        std::vector<uint32_t> next(n, 0);
        for (size_t i = 0; i < slots; ++i) next[size_t(order[i]) * stride] = order[(i + 1) % slots] * uint32_t(stride);
        uint32_t* d_next = reinterpret_cast<uint32_t*>(src);
        CHECK(cudaMemcpy(d_next, next.data(), n * 4, cudaMemcpyHostToDevice));
        uint32_t* d_out = reinterpret_cast<uint32_t*>(dst);
        const uint32_t hops = quick ? 20000 : 100000;
        chase<<<1, 1>>>(d_next, 1000, d_out);
        CHECK(cudaDeviceSynchronize());
        cudaEvent_t a, b;
        CHECK(cudaEventCreate(&a));
        CHECK(cudaEventCreate(&b));
        CHECK(cudaEventRecord(a));
        chase<<<1, 1>>>(d_next, hops, d_out);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        double ns = ms * 1e6 / hops;
        std::printf("## Latency\n\nA dependent load from HBM, idle: %.0f ns\n", ns);
        json.key("idle_latency_s");
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.4g", ns * 1e-9);
        json.text += buf;
    }
    json.text += "\n}\n";
    if (json_path) {
        FILE* f = std::fopen(json_path, "w");
        if (!f) {
            std::fprintf(stderr, "probe: cannot write %s\n", json_path);
            return 1;
        }
        std::fputs(json.text.c_str(), f);
        std::fclose(f);
    }
    CHECK(cudaFree(src));
    CHECK(cudaFree(dst));
    return 0;
}
