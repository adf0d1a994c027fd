// Device-limit profiles: parsing, lookup and clamping (see device_profile.h).
#include "host/device_profile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "host/device_profiles/embedded_profiles.h"

namespace blue {

namespace {

using json = nlohmann::json;

// One limit a profile may clamp: its Vulkan name, how many values (1 or 3), its largest legal
// value, whether it is an alignment (stricter is larger), and where DeviceInfo keeps it.
struct LimitKey {
    const char* key;
    uint32_t count;
    uint64_t max;
    bool alignment;
    uint64_t (*get)(const DeviceInfo&, int);
    void (*set)(DeviceInfo&, int, uint64_t);
};

#define BLUE_LIMIT(KEY, FIELD, MAX)                                                     \
    LimitKey {                                                                          \
        KEY, 1, MAX, false, [](const DeviceInfo& d, int) { return uint64_t(d.FIELD); }, \
            [](DeviceInfo& d, int, uint64_t v) { d.FIELD = decltype(d.FIELD)(v); }      \
    }
#define BLUE_LIMIT3(KEY, FIELD)                                                \
    LimitKey {                                                                 \
        KEY, 3, UINT32_MAX, false,                                             \
            [](const DeviceInfo& d, int i) { return uint64_t(d.FIELD[i]); },   \
            [](DeviceInfo& d, int i, uint64_t v) { d.FIELD[i] = uint32_t(v); } \
    }

const LimitKey kLimits[] = {
    BLUE_LIMIT("maxStorageBufferRange", max_storage_buffer_range, UINT32_MAX),
    BLUE_LIMIT("maxMemoryAllocationSize", max_allocation, UINT64_MAX),
    BLUE_LIMIT("maxMemoryAllocationCount", max_allocations, UINT32_MAX),
    BLUE_LIMIT("deviceLocalHeapSize", device_local_bytes, UINT64_MAX),
    BLUE_LIMIT("maxTexelBufferElements", max_texel_buffer_elements, UINT32_MAX),
    BLUE_LIMIT("maxComputeSharedMemorySize", max_shared_memory, UINT32_MAX),
    BLUE_LIMIT("maxComputeWorkGroupInvocations", max_workgroup_invocations, UINT32_MAX),
    BLUE_LIMIT3("maxComputeWorkGroupSize", max_workgroup_size),
    BLUE_LIMIT3("maxComputeWorkGroupCount", max_workgroup_count),
    BLUE_LIMIT("maxPerStageDescriptorStorageBuffers", max_stage_storage_buffers, UINT32_MAX),
    BLUE_LIMIT("maxPerStageDescriptorStorageImages", max_stage_storage_images, UINT32_MAX),
    BLUE_LIMIT("maxPerStageResources", max_stage_resources, UINT32_MAX),
    BLUE_LIMIT("maxDescriptorSetStorageBuffers", max_set_storage_buffers, UINT32_MAX),
    BLUE_LIMIT("maxDescriptorSetStorageImages", max_set_storage_images, UINT32_MAX),
    BLUE_LIMIT("maxBoundDescriptorSets", max_bound_sets, UINT32_MAX),
    BLUE_LIMIT("maxPushConstantsSize", max_push_constants, UINT32_MAX),
    LimitKey{"minStorageBufferOffsetAlignment", 1, 256, true,
             [](const DeviceInfo& d, int) { return uint64_t(d.min_storage_offset_alignment); },
             [](DeviceInfo& d, int, uint64_t v) { d.min_storage_offset_alignment = uint32_t(v); }},
};

#undef BLUE_LIMIT
#undef BLUE_LIMIT3

struct FeatureKey {
    const char* key;
    bool DeviceInfo::*field;
};

const FeatureKey kFeatures[] = {
    {"shaderStorageBufferArrayDynamicIndexing", &DeviceInfo::dynamic_indexing},
    {"shaderStorageBufferArrayNonUniformIndexing", &DeviceInfo::nonuniform_indexing},
    {"subgroupBallot", &DeviceInfo::subgroup_ballot},
    {"timelineSemaphore", &DeviceInfo::timeline},
    {"shaderInt64", &DeviceInfo::int64},
    {"shaderFloat16", &DeviceInfo::float16},
    {"shaderInt8", &DeviceInfo::int8},
    {"storageBuffer8BitAccess", &DeviceInfo::storage8},
    {"shaderIntegerDotProduct", &DeviceInfo::int_dot},
    {"integerDotProduct4x8BitPackedSignedAccelerated", &DeviceInfo::int_dot_accelerated},
    {"conditionalRendering", &DeviceInfo::conditional_rendering},
};

const LimitKey* findLimit(const std::string& key) {
    for (const LimitKey& k : kLimits) {
        if (key == k.key) return &k;
    }
    return nullptr;
}

const FeatureKey* findFeature(const std::string& key) {
    for (const FeatureKey& f : kFeatures) {
        if (key == f.key) return &f;
    }
    return nullptr;
}

std::string shown(const json& v) {
    std::string s = v.dump();
    return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// An unsigned integer in [1, k.max] (a power of two for alignments).
Result<uint64_t> limitValue(const json& v, const LimitKey& k, const std::string& where) {
    if (!v.is_number_unsigned()) {
        return BLUE_ERROR("key '%s': expected an unsigned integer, got %s", where.c_str(),
                          shown(v).c_str());
    }
    uint64_t x = v.get<uint64_t>();
    if (x == 0 || x > k.max) {
        return BLUE_ERROR("key '%s': %llu is out of range (1 to %llu)", where.c_str(),
                          (unsigned long long)x, (unsigned long long)k.max);
    }
    if (k.alignment && (x & (x - 1)) != 0) {
        return BLUE_ERROR("key '%s': an alignment must be a power of two, not %llu", where.c_str(),
                          (unsigned long long)x);
    }
    return x;
}

Status parseLimits(const json& limits, DeviceProfile& p) {
    if (!limits.is_object()) return BLUE_ERROR("key 'limits': expected an object");
    for (const auto& [key, v] : limits.items()) {
        const LimitKey* k = findLimit(key);
        std::string where = "limits." + key;
        if (!k) return BLUE_ERROR("key '%s': not a limit BlueVM knows", where.c_str());
        std::vector<uint64_t> values;
        if (k->count == 1) {
            Result<uint64_t> x = limitValue(v, *k, where);
            if (!x) return x.status();
            values.push_back(x.value());
        } else {
            if (!v.is_array() || v.size() != k->count) {
                return BLUE_ERROR("key '%s': expected an array of %u unsigned integers, got %s",
                                  where.c_str(), k->count, shown(v).c_str());
            }
            for (size_t i = 0; i < v.size(); ++i) {
                Result<uint64_t> x = limitValue(v[i], *k, strFormat("%s[%zu]", where.c_str(), i));
                if (!x) return x.status();
                values.push_back(x.value());
            }
        }
        p.limits[key] = values;
    }
    return Status::ok();
}

Status parseFeatures(const json& features, DeviceProfile& p) {
    if (!features.is_object()) return BLUE_ERROR("key 'features': expected an object");
    for (const auto& [key, v] : features.items()) {
        if (!findFeature(key)) {
            return BLUE_ERROR("key 'features.%s': not a feature BlueVM knows", key.c_str());
        }
        if (!v.is_boolean()) {
            return BLUE_ERROR("key 'features.%s': expected true or false, got %s", key.c_str(),
                              shown(v).c_str());
        }
        p.features[key] = v.get<bool>();
    }
    return Status::ok();
}

// "1.2" or "1.2.3" (the patch is ignored) -> VK_MAKE_API_VERSION(0, 1, 2, 0).
Status parseApiVersion(const json& v, DeviceProfile& p) {
    unsigned major = 0, minor = 0, patch = 0;
    int used = 0;
    std::string s = v.is_string() ? v.get<std::string>() : "";
    int n = std::sscanf(s.c_str(), "%u.%u%n.%u%n", &major, &minor, &used, &patch, &used);
    if (n < 2 || size_t(used) != s.size() || major != 1 || minor > 4) {
        return BLUE_ERROR("key 'apiVersion': expected a Vulkan version such as \"1.2\", got %s",
                          shown(v).c_str());
    }
    p.api_version = VK_MAKE_API_VERSION(0, major, minor, 0);
    return Status::ok();
}

Status parseNotes(const json& notes, DeviceProfile& p) {
    if (!notes.is_object()) return BLUE_ERROR("key 'notes': expected an object");
    for (const auto& [key, v] : notes.items()) {
        if (!findLimit(key) && !findFeature(key) && key != "apiVersion") {
            return BLUE_ERROR("key 'notes.%s': a note must name a limit or feature of the profile",
                              key.c_str());
        }
        if (!v.is_string()) {
            return BLUE_ERROR("key 'notes.%s': expected a string", key.c_str());
        }
        p.notes[key] = v.get<std::string>();
    }
    return Status::ok();
}

Status requiredString(const json& root, const char* key, std::string* out) {
    auto it = root.find(key);
    if (it == root.end() || !it->is_string() || it->get<std::string>().empty()) {
        return BLUE_ERROR("key '%s': missing, or not a non-empty string", key);
    }
    *out = it->get<std::string>();
    return Status::ok();
}

Status parseRoot(const json& root, DeviceProfile& p) {
    if (!root.is_object()) return BLUE_ERROR("expected a JSON object at the top level");
    for (const auto& [key, v] : root.items()) {
        if (key == "name" || key == "device" || key == "source") continue;
        if (key == "apiVersion") {
            BLUE_TRY(parseApiVersion(v, p));
        } else if (key == "limits") {
            BLUE_TRY(parseLimits(v, p));
        } else if (key == "features") {
            BLUE_TRY(parseFeatures(v, p));
        } else if (key == "notes") {
            BLUE_TRY(parseNotes(v, p));
        } else {
            return BLUE_ERROR(
                "key '%s': not a profile key (name, device, source, apiVersion, "
                "limits, features, notes)",
                key.c_str());
        }
    }
    BLUE_TRY(requiredString(root, "name", &p.name));
    BLUE_TRY(requiredString(root, "device", &p.device));
    BLUE_TRY(requiredString(root, "source", &p.source));
    bool plain = std::all_of(p.name.begin(), p.name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
    });
    if (!plain) return BLUE_ERROR("key 'name': use lowercase letters, digits, '-' and '.' only");
    return Status::ok();
}

Result<std::string> readProfileFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        return BLUE_ERROR("cannot read device profile '%s': %s", path.c_str(),
                          std::strerror(errno));
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str().size() > (1u << 20)) {
        return BLUE_ERROR("device profile '%s' is larger than 1 MiB; not a profile", path.c_str());
    }
    return text.str();
}

std::string formatApi(uint32_t v) {
    return strFormat("%u.%u", VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v));
}

}  // namespace

Result<DeviceProfile> parseDeviceProfile(const std::string& text, const std::string& origin) {
    json root;
    try {
        root = json::parse(text);
    } catch (const json::parse_error& e) {
        return BLUE_ERROR("%s: not valid JSON (byte %zu)", origin.c_str(), size_t(e.byte));
    } catch (const json::exception& e) {
        return BLUE_ERROR("%s: not valid JSON (%s)", origin.c_str(), e.what());
    }
    DeviceProfile p;
    Status s = parseRoot(root, p);
    if (!s) return s.prefix(origin);
    return p;
}

std::vector<std::string> builtinProfileNames() {
    std::vector<std::string> names;
    for (size_t i = 0; i < kEmbeddedProfileCount; ++i) names.push_back(kEmbeddedProfiles[i].name);
    std::sort(names.begin(), names.end());
    return names;
}

Result<std::string> builtinProfileText(const std::string& name) {
    for (size_t i = 0; i < kEmbeddedProfileCount; ++i) {
        if (name == kEmbeddedProfiles[i].name) return std::string(kEmbeddedProfiles[i].json);
    }
    return BLUE_ERROR("no built-in device profile named '%s'", name.c_str());
}

Result<DeviceProfile> loadDeviceProfile(const std::string& spec) {
    bool path = spec.find('/') != std::string::npos ||
                (spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".json") == 0);
    if (path) {
        Result<std::string> text = readProfileFile(spec);
        if (!text) return text.status();
        return parseDeviceProfile(text.value(), "device profile '" + spec + "'");
    }
    for (size_t i = 0; i < kEmbeddedProfileCount; ++i) {
        if (spec == kEmbeddedProfiles[i].name) {
            return parseDeviceProfile(kEmbeddedProfiles[i].json,
                                      "built-in device profile '" + spec + "'");
        }
    }
    std::string names;
    for (const std::string& n : builtinProfileNames()) names += (names.empty() ? "" : ", ") + n;
    return BLUE_ERROR(
        "no built-in device profile named '%s' (built-in: %s); a profile file's path "
        "must contain '/' or end in .json",
        spec.c_str(), names.c_str());
}

Result<DeviceProfile> profileFromOptions(const std::string& limits) {
    std::string spec = limits;
    if (spec.empty()) {
        if (const char* env = std::getenv("BLUE_DEVICE_LIMITS")) spec = env;
    }
    if (spec.empty() || spec == "none") return DeviceProfile{};
    return loadDeviceProfile(spec);
}

void applyDeviceProfile(const DeviceProfile& profile, DeviceInfo& info) {
    info.profile = profile.name;
    for (const LimitKey& k : kLimits) {
        auto it = profile.limits.find(k.key);
        if (it == profile.limits.end()) continue;
        for (uint32_t i = 0; i < k.count; ++i) {
            uint64_t real = k.get(info, int(i)), want = it->second[i];
            uint64_t now = k.alignment ? std::max(real, want) : std::min(real, want);
            if (now == real) continue;
            k.set(info, int(i), now);
            std::string key = k.count == 1 ? k.key : strFormat("%s[%u]", k.key, i);
            info.clamped.push_back(strFormat("%s %llu -> %llu", key.c_str(),
                                             (unsigned long long)real, (unsigned long long)now));
        }
    }
    for (const FeatureKey& f : kFeatures) {
        auto it = profile.features.find(f.key);
        if (it == profile.features.end() || it->second || !(info.*f.field)) continue;
        info.*f.field = false;
        info.clamped.push_back(std::string(f.key) + " off");
    }
    uint32_t api = VK_MAKE_API_VERSION(0, VK_API_VERSION_MAJOR(info.api_version),
                                       VK_API_VERSION_MINOR(info.api_version), 0);
    if (profile.api_version && profile.api_version < api) {
        info.clamped.push_back("apiVersion " + formatApi(info.api_version) + " -> " +
                               formatApi(profile.api_version));
        info.api_version = profile.api_version;
        info.api = formatApi(profile.api_version) + " (emulated)";
    }
}

void writeClampedLimits(const DeviceInfo& info, VkPhysicalDeviceProperties& props,
                        VkPhysicalDeviceMemoryProperties& memory) {
    VkPhysicalDeviceLimits& l = props.limits;
    props.apiVersion = std::min(props.apiVersion, info.api_version);
    l.maxStorageBufferRange = uint32_t(info.max_storage_buffer_range);
    l.maxTexelBufferElements = uint32_t(info.max_texel_buffer_elements);
    l.maxComputeSharedMemorySize = info.max_shared_memory;
    l.maxComputeWorkGroupInvocations = info.max_workgroup_invocations;
    for (int i = 0; i < 3; ++i) {
        l.maxComputeWorkGroupSize[i] = info.max_workgroup_size[i];
        l.maxComputeWorkGroupCount[i] = info.max_workgroup_count[i];
    }
    l.minStorageBufferOffsetAlignment = info.min_storage_offset_alignment;
    l.maxPerStageDescriptorStorageBuffers = info.max_stage_storage_buffers;
    l.maxPerStageDescriptorStorageImages = info.max_stage_storage_images;
    l.maxPerStageResources = info.max_stage_resources;
    l.maxDescriptorSetStorageBuffers = info.max_set_storage_buffers;
    l.maxDescriptorSetStorageImages = info.max_set_storage_images;
    l.maxBoundDescriptorSets = info.max_bound_sets;
    l.maxPushConstantsSize = info.max_push_constants;
    for (uint32_t h = 0; h < memory.memoryHeapCount; ++h) {
        VkMemoryHeap& heap = memory.memoryHeaps[h];
        if (heap.flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
            heap.size = std::min<VkDeviceSize>(heap.size, info.device_local_bytes);
        }
    }
}

}  // namespace blue
