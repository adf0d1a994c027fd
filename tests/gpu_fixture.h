// One Vulkan device and pipeline set for the whole test binary, created on first use with the
// Khronos validation layer on. GPU tests call gpu() and end with CHECK_NO_VALIDATION_ERRORS().
// The device comes from BLUE_DEVICE (default: the usual preference order; lavapipe on CI).
#pragma once

#include <doctest/doctest.h>

#include <memory>

#include "host/device.h"
#include "host/machine.h"
#include "host/pipelines.h"

namespace blue::test {

struct Gpu {
    std::unique_ptr<Device> device;
    std::unique_ptr<Pipelines> pipelines;
};

// The shared device; fails the calling test when no usable Vulkan device exists.
Gpu& gpu();

// A device of its own, emulating the device-limit profile given as JSON text (validation as for
// the shared device); fails the calling test when it cannot be made.
std::unique_ptr<Device> emulatedDevice(const std::string& profile_json);

// Runs a module on the GPU and on the reference machine with the same inputs. Chains keep
// `chain_cycles` (no watchdog bound) unless `max_submit_ms` is given.
struct BothRuns {
    RunReport gpu, ref;
    GpuStats stats;
};
BothRuns runBoth(const Module& m, const WeightSource& w, uint32_t instances,
                 const std::vector<std::vector<uint32_t>>& inputs = {}, uint64_t max_cycles = 100000,
                 uint32_t chain_cycles = 16, double max_submit_ms = 0);

}  // namespace blue::test

#define CHECK_NO_VALIDATION_ERRORS()                                                       \
    do {                                                                                   \
        INFO("last validation message: " << ::blue::test::gpu().device->lastValidationMessage()); \
        CHECK(::blue::test::gpu().device->validationErrors() == 0u);                       \
    } while (0)
