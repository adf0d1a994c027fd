// Device-limit profiles: emulate another GPU's limits and features on the device at hand, so the
// whole suite runs as if on a typical NVIDIA, AMD, Intel or mobile GPU. A profile is a JSON file
// (format: host/device_profiles/README.md); the files in host/device_profiles/ are built into the
// binary and found by name. Applying a profile only lowers what BlueVM believes: each limit
// becomes min(real, profile) (an alignment max(real, profile)), and a feature can be turned off,
// never on. Profile files are untrusted input: every error names the file and the key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "host/device.h"
#include "vm/status.h"

namespace blue {

struct DeviceProfile {
    std::string name;                                     // e.g. "nvidia-rtx4090"
    std::string device;                                   // the GPU and driver it describes
    std::string source;                                   // where its numbers come from
    uint32_t api_version = 0;                             // "apiVersion" (0: not clamped)
    std::map<std::string, std::vector<uint64_t>> limits;  // Vulkan limit name -> 1 or 3 values
    std::map<std::string, bool> features;                 // feature name -> false turns it off
    std::map<std::string, std::string> notes;             // per key: how sure the number is
};

// Parses a profile. `origin` (a path or "built-in profile NAME") prefixes every error, which
// names the offending key: bad JSON (with the byte offset), a missing name or source, an unknown
// key, a value of the wrong type or out of range (a limit of 0, an alignment not a power of two).
Result<DeviceProfile> parseDeviceProfile(const std::string& text, const std::string& origin);

// Loads a built-in profile by name, or a profile file when `spec` contains '/' or ends in
// ".json". Fails naming the spec (and listing the built-in names) when neither exists.
Result<DeviceProfile> loadDeviceProfile(const std::string& spec);

// The names of the built-in profiles, sorted.
std::vector<std::string> builtinProfileNames();
// A built-in profile's file text (a start for one's own profile file).
Result<std::string> builtinProfileText(const std::string& name);

// The profile DeviceOptions::limits asks for: `limits`, else BLUE_DEVICE_LIMITS, else none
// (an empty name).
Result<DeviceProfile> profileFromOptions(const std::string& limits);

// Lowers `info` to the profile: limits to min(real, profile), alignments to max(real, profile),
// features the profile turns off to unsupported. Records each change in info.clamped and the
// profile's name in info.profile. Never raises anything.
void applyDeviceProfile(const DeviceProfile& profile, DeviceInfo& info);

// Writes info's (clamped) limits into the Vulkan structures BlueVM hands out, so no code path
// can read an unclamped limit through Device::props() or Device::memory().
void writeClampedLimits(const DeviceInfo& info, VkPhysicalDeviceProperties& props,
                        VkPhysicalDeviceMemoryProperties& memory);

}  // namespace blue
