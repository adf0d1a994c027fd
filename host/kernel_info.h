// What BlueVM's embedded kernels ask of a device, read from their SPIR-V instead of restated:
// each kernel's workgroup size, its workgroup (shared) memory and the SPIR-V capabilities it
// declares. host/device.cpp compares these needs with a device's (possibly emulated) limits and
// features, so a device that cannot run a kernel is refused at start, naming the kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "vm/status.h"

namespace blue {

// SPIR-V capability numbers BlueVM looks for (SPIR-V specification, "Capability").
enum class SpvCap : uint32_t {
    kFloat16 = 9,
    kFloat64 = 10,
    kInt64 = 11,
    kInt16 = 22,
    kInt8 = 39,
    kGroupNonUniform = 61,
    kGroupNonUniformVote = 62,
    kGroupNonUniformArithmetic = 63,
    kGroupNonUniformBallot = 64,
    kGroupNonUniformShuffle = 65,
    kStorageBuffer16BitAccess = 4433,
    kStorageBuffer8BitAccess = 4448,
    kDotProductInput4x8BitPacked = 6018,
    kDotProduct = 6019,
};

struct KernelInfo {
    std::string name;
    uint32_t local_size[3] = {1, 1, 1};
    uint64_t shared_bytes = 0;  // Workgroup storage-class variables, naturally packed
    std::set<uint32_t> capabilities;

    uint64_t invocations() const { return uint64_t(local_size[0]) * local_size[1] * local_size[2]; }
    bool uses(SpvCap c) const { return capabilities.count(uint32_t(c)) != 0; }
};

// Reads one compute module. Fails naming the word offset when the binary is malformed (a
// truncated instruction, a bad magic number) or has no LocalSize execution mode.
Result<KernelInfo> reflectKernel(const std::string& name, const uint32_t* words, size_t count);

// Every embedded kernel, reflected once (a malformed embedded kernel is a build bug: asserts).
const std::vector<KernelInfo>& embeddedKernels();

}  // namespace blue
