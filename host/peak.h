// The device's own ceilings, measured with Vulkan micro-kernels (shaders/peak/): streaming read
// bandwidth over a buffer far larger than the last-level cache, and FP32 multiply-add throughput.
// Each ceiling is measured in several kernel shapes (texel vs storage buffer, lanes per walk,
// independent chains, workgroup size), because which shape reaches the device's limit differs
// between devices (on lavapipe a GPU-style walk reads 2-20 GB/s where its best reaches 50); the
// best shape is the ceiling. `bluevm devices --peak` prints them; `bluevm bench` reads its
// speeds against them and against the host's native figures (host/bench.h).
#pragma once

#include <string>
#include <vector>

#include "host/device.h"

namespace blue {

struct PeakShape {
    std::string what;      // e.g. "uimageBuffer imageLoad, 8 lanes per walk, workgroup 64"
    double value = 0;      // GB/s (read) or GFLOP/s (fma); 0 when skipped
    std::string skipped;   // why it was not measured on this device (empty: measured)
};

struct DevicePeak {
    uint64_t read_bytes = 0;  // what the texel-buffer shapes stream (storage ones: up to one binding)
    std::vector<PeakShape> read, fma;
    double readGBs() const;     // the best read shape
    double fmaGFlops() const;   // the best FMA shape
    const PeakShape* bestRead() const;
    const PeakShape* bestFma() const;
};

struct PeakOptions {
    uint64_t read_bytes = 512ull << 20;  // clamped to the device's binding and allocation limits
    int reps = 3;                        // per shape; the best counts
    double fma_ms = 40;                  // GPU time each FMA measurement aims at
};

// Measures every shape on `dev`. Each read shape's result is checked: the kernels XOR every word
// they read, and the XOR must equal the host's over the whole buffer (so a shape that skipped part
// of the buffer fails instead of reporting a speed it did not reach).
Result<DevicePeak> measureDevicePeak(Device& dev, const PeakOptions& options = {});

}  // namespace blue
