// Native memory-bandwidth measurement (see bench.h): each thread sums its share of a large
// buffer of 64-bit words, touched beforehand so page faults are not timed.
#include "host/bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace blue {

namespace {

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

}  // namespace blue
