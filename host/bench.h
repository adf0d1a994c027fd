// Machine measurements that benchmarks are read against: this machine's memory read bandwidth and
// FP32 multiply-add throughput (native code, all cores), so a speed can be stated as a fraction of
// what native code reaches on the same cores (host/peak.h measures the Vulkan device's own).
#pragma once

#include <cstdint>

namespace blue {

struct BandwidthResult {
    double gb_per_s = 0;  // best of the repetitions
    unsigned threads = 0;
    uint64_t bytes = 0;   // buffer size read
};

// Reads a `bytes` buffer with `threads` threads (0: all cores), `reps` times; returns the best.
BandwidthResult measureReadBandwidth(uint64_t bytes = 512ull << 20, unsigned threads = 0, int reps = 5);

struct FmaResult {
    double gflops = 0;  // best of the repetitions, all threads
    unsigned threads = 0;
    const char* isa = "";  // "AVX-512", "AVX2" or "scalar"
};

// FP32 fused multiply-add throughput of native code on every core (the widest vector unit the
// CPU has, chosen at run time), best of `reps`.
FmaResult measureNativeFma(unsigned threads = 0, int reps = 5);

}  // namespace blue
