// What BlueVM needs of a device, and what it does with each optional feature. Two sources, each
// stated once: the binding layout of shaders/blue_config.h (storage buffers and texel views per
// stage, push constants, descriptor sets) and the embedded kernels' SPIR-V (workgroup sizes,
// shared memory, capabilities; host/kernel_info.h), counting only the kernel variants chosen for
// the device (host/pipelines.h). A device that misses a need is refused at start with its name.
#pragma once

#include <string>
#include <vector>

#include "host/device.h"

namespace blue {

struct DeviceNeed {
    std::string what;  // a Vulkan limit or feature name
    uint64_t need = 0, have = 0;
    std::string why;  // which binding layout or kernel needs it
    bool met() const { return have >= need; }
};

// Every need, met or not, for `bluevm devices` and the tests.
std::vector<DeviceNeed> deviceNeeds(const DeviceInfo& info);

// The unmet needs as one line ("maxComputeWorkGroupInvocations: 128 < 256 (...); ..."), empty
// when the device can run BlueVM.
std::string unmetNeeds(const DeviceInfo& info);

// The features BlueVM looks at, each with what BlueVM uses it for ("required", "chooses the
// sequencer variant", "unused: no kernel declares the Float16 capability", ...).
std::vector<DeviceFeature> describeFeatures(const DeviceInfo& info);

}  // namespace blue
