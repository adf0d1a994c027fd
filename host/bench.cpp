// Native ceilings (see bench.h). Bandwidth: each thread sums its share of a large buffer of 64-bit
// words, touched beforehand so page faults are not timed. FMA: each thread runs independent
// vector FMA chains (enough to cover the FMA latency) in the widest ISA the CPU supports.
#include "host/bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace blue {

namespace {

constexpr int kChains = 12;  // independent accumulators: FMA latency 4 x 2 ports, with margin

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float fmaAvx512(uint64_t iterations) {
    __m512 x[kChains];
    const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    for (int k = 0; k < kChains; ++k) x[k] = _mm512_set1_ps(float(k) + 0.5f);
    for (uint64_t i = 0; i < iterations; ++i) {
        for (int k = 0; k < kChains; ++k) x[k] = _mm512_fmadd_ps(x[k], m, c);
    }
    __m512 s = x[0];
    for (int k = 1; k < kChains; ++k) s = _mm512_add_ps(s, x[k]);
    float out[16];
    _mm512_storeu_ps(out, s);
    float sum = 0;
    for (float v : out) sum += v;
    return sum;
}

__attribute__((target("avx2,fma"))) float fmaAvx2(uint64_t iterations) {
    __m256 x[kChains];
    const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (int k = 0; k < kChains; ++k) x[k] = _mm256_set1_ps(float(k) + 0.5f);
    for (uint64_t i = 0; i < iterations; ++i) {
        for (int k = 0; k < kChains; ++k) x[k] = _mm256_fmadd_ps(x[k], m, c);
    }
    __m256 s = x[0];
    for (int k = 1; k < kChains; ++k) s = _mm256_add_ps(s, x[k]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

float fmaScalar(uint64_t iterations) {
    float x[kChains];
    for (int k = 0; k < kChains; ++k) x[k] = float(k) + 0.5f;
    for (uint64_t i = 0; i < iterations; ++i) {
        for (int k = 0; k < kChains; ++k) x[k] = x[k] * 0.999f + 1e-3f;
    }
    float s = 0;
    for (int k = 0; k < kChains; ++k) s += x[k];
    return s;
}

uint64_t sumRange(const uint64_t* p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    for (; i < n; ++i) a += p[i];
    return a + b + c + d;
}

}  // namespace

BandwidthResult measureReadBandwidth(uint64_t bytes, unsigned threads, int reps) {
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    size_t words = bytes / 8;
    std::unique_ptr<uint64_t[]> buf(new uint64_t[words]);
    for (size_t i = 0; i < words; ++i) buf[i] = i;
    BandwidthResult r{0, threads, words * 8};
    std::atomic<uint64_t> sink{0};
    for (int rep = 0; rep < reps; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> pool;
        size_t per = words / threads;
        for (unsigned t = 0; t < threads; ++t) {
            size_t n = t + 1 == threads ? words - t * per : per;
            pool.emplace_back([&, t, n] { sink += sumRange(buf.get() + t * per, n); });
        }
        for (std::thread& th : pool) th.join();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.gb_per_s = std::max(r.gb_per_s, double(words * 8) / s / 1e9);
    }
    if (sink.load() == 42) r.gb_per_s += 0;  // keeps the sums observable
    return r;
}

FmaResult measureNativeFma(unsigned threads, int reps) {
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    FmaResult r;
    r.threads = threads;
    float (*kernel)(uint64_t) = fmaScalar;
    int lanes = 1;
    r.isa = "scalar";
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        kernel = fmaAvx512;
        lanes = 16;
        r.isa = "AVX-512";
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        kernel = fmaAvx2;
        lanes = 8;
        r.isa = "AVX2";
    }
#endif
    const uint64_t iterations = 20'000'000;
    std::atomic<uint32_t> sink{0};
    for (int rep = 0; rep < reps; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t) {
            pool.emplace_back([&] { sink += uint32_t(kernel(iterations)); });
        }
        for (std::thread& th : pool) th.join();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double flops = 2.0 * lanes * kChains * double(iterations) * threads;
        r.gflops = std::max(r.gflops, flops / s / 1e9);
    }
    if (sink.load() == 42) r.gflops += 0;  // keeps the results observable
    return r;
}

}  // namespace blue
