// Machine measurements that benchmarks are read against: this machine's memory read bandwidth
// (native code, all cores), so a decode speed can be stated as a fraction of the bandwidth limit.
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

}  // namespace blue
