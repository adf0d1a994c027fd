// What BlueVM needs of a device (see device_needs.h).
#include "host/device_needs.h"

#include <algorithm>

#include "host/kernel_info.h"
#include "host/pipelines.h"
#include "shaders/blue_config.h"

namespace blue {

namespace {

// A SPIR-V capability and the device feature that allows it. Capabilities every Vulkan 1.2
// device has (Shader, ImageBuffer, GroupNonUniform in compute) need nothing; any other one a
// kernel declares without a row here is an unmet need, so a new use cannot slip past the check.
struct CapabilityFeature {
    SpvCap cap;
    const char* feature;
    bool DeviceInfo::*field;
};

const CapabilityFeature kCapabilityFeatures[] = {
    {SpvCap::kGroupNonUniformBallot, "subgroupBallot", &DeviceInfo::subgroup_ballot},
    {SpvCap::kInt64, "shaderInt64", &DeviceInfo::int64},
    {SpvCap::kFloat16, "shaderFloat16", &DeviceInfo::float16},
    {SpvCap::kInt8, "shaderInt8", &DeviceInfo::int8},
    {SpvCap::kStorageBuffer8BitAccess, "storageBuffer8BitAccess", &DeviceInfo::storage8},
    {SpvCap::kDotProduct, "shaderIntegerDotProduct", &DeviceInfo::int_dot},
    {SpvCap::kDotProductInput4x8BitPacked, "shaderIntegerDotProduct", &DeviceInfo::int_dot},
};

constexpr uint32_t kFreeCapabilities[] = {1 /* Shader */, 47 /* ImageBuffer */,
                                          61 /* GroupNonUniform */};

// The kernels this device runs: every embedded kernel but the variants not chosen for it.
std::vector<const KernelInfo*> usedKernels(const DeviceInfo& info) {
    std::vector<const KernelInfo*> used;
    for (const KernelInfo& k : embeddedKernels()) {
        if (kernelChosen(k.name, info)) used.push_back(&k);
    }
    return used;
}

// The kernel with the largest value of f, for the need's explanation.
template <class F>
const KernelInfo* largest(const std::vector<const KernelInfo*>& kernels, F f) {
    const KernelInfo* best = nullptr;
    for (const KernelInfo* k : kernels) {
        if (!best || f(*k) > f(*best)) best = k;
    }
    return best;
}

void addKernelNeeds(const DeviceInfo& info, std::vector<DeviceNeed>& needs) {
    std::vector<const KernelInfo*> used = usedKernels(info);
    if (used.empty()) return;
    const KernelInfo* k = largest(used, [](const KernelInfo& x) { return x.invocations(); });
    needs.push_back({"maxComputeWorkGroupInvocations", k->invocations(),
                     info.max_workgroup_invocations, "kernel '" + k->name + "'"});
    for (int i = 0; i < 3; ++i) {
        k = largest(used, [i](const KernelInfo& x) { return x.local_size[i]; });
        needs.push_back({strFormat("maxComputeWorkGroupSize[%d]", i), k->local_size[i],
                         info.max_workgroup_size[i], "kernel '" + k->name + "'"});
    }
    k = largest(used, [](const KernelInfo& x) { return x.shared_bytes; });
    needs.push_back({"maxComputeSharedMemorySize", k->shared_bytes, info.max_shared_memory,
                     "kernel '" + k->name + "' (bytes of shared variables)"});
    std::vector<uint32_t> seen;
    for (const KernelInfo* kernel : used) {
        for (uint32_t cap : kernel->capabilities) {
            bool free = std::find(std::begin(kFreeCapabilities), std::end(kFreeCapabilities),
                                  cap) != std::end(kFreeCapabilities);
            if (free || std::find(seen.begin(), seen.end(), cap) != seen.end()) continue;
            seen.push_back(cap);
            auto row =
                std::find_if(std::begin(kCapabilityFeatures), std::end(kCapabilityFeatures),
                             [cap](const CapabilityFeature& c) { return uint32_t(c.cap) == cap; });
            std::string why =
                strFormat("kernel '%s' declares SPIR-V capability %u", kernel->name.c_str(), cap);
            if (row == std::end(kCapabilityFeatures)) {
                needs.push_back({strFormat("a feature for SPIR-V capability %u", cap), 1, 0,
                                 why + ", which BlueVM does not know how to check"});
            } else {
                needs.push_back({row->feature, 1, info.*(row->field) ? 1u : 0u, why});
            }
        }
    }
}

std::string kernelsUsing(const DeviceInfo& info, SpvCap cap) {
    std::string names;
    for (const KernelInfo* k : usedKernels(info)) {
        if (k->uses(cap)) names += (names.empty() ? "" : ", ") + k->name;
    }
    return names;
}

// What a capability-backed feature is used for: the kernels that declare it, or "unused".
std::string capabilityUse(const DeviceInfo& info, SpvCap cap, const char* spv_name) {
    std::string names = kernelsUsing(info, cap);
    if (!names.empty()) return "required by " + names;
    return strFormat("unused: no kernel declares the %s capability", spv_name);
}

}  // namespace

std::vector<DeviceNeed> deviceNeeds(const DeviceInfo& info) {
    const uint32_t buffers = BLUE_MAX_PAGES + 2, views = BLUE_MAX_TEX_OPERANDS;
    const std::string layout =
        strFormat("shaders/blue_config.h: control, I/O and %u pages", BLUE_MAX_PAGES);
    const std::string operands = strFormat(
        "shaders/blue_config.h: %u texel views of tensor operands", BLUE_MAX_TEX_OPERANDS);
    std::vector<DeviceNeed> needs = {
        {"apiVersion 1.2", VK_API_VERSION_1_2, info.api_version,
         "kernels are SPIR-V 1.5 for Vulkan 1.2"},
        {"shaderStorageBufferArrayDynamicIndexing", 1, info.dynamic_indexing ? 1u : 0u,
         "kernels index the page array with a page number from push constants"},
        {"maxPerStageDescriptorStorageBuffers", buffers, info.max_stage_storage_buffers, layout},
        {"maxDescriptorSetStorageBuffers", buffers, info.max_set_storage_buffers, layout},
        {"maxPerStageDescriptorStorageImages", views, info.max_stage_storage_images, operands},
        {"maxDescriptorSetStorageImages", views, info.max_set_storage_images, operands},
        {"maxPerStageResources", buffers + views, info.max_stage_resources, layout + " + operands"},
        {"maxBoundDescriptorSets", 2, info.max_bound_sets, "set 0 (buffers) and set 1 (operands)"},
        {"maxPushConstantsSize", BLUE_PUSH_WORDS * 4, info.max_push_constants,
         "shaders/blue_config.h: BLUE_PUSH_WORDS"},
    };
    addKernelNeeds(info, needs);
    return needs;
}

std::string unmetNeeds(const DeviceInfo& info) {
    std::string out;
    for (const DeviceNeed& n : deviceNeeds(info)) {
        if (n.met()) continue;
        std::string line;
        if (n.need == 1 && n.have == 0) {
            line = n.what + " (" + n.why + ")";
        } else if (n.what == "apiVersion 1.2") {
            line = strFormat("Vulkan 1.2 (the device has %u.%u)", VK_API_VERSION_MAJOR(n.have),
                             VK_API_VERSION_MINOR(n.have));
        } else {
            line = strFormat("%s %llu < %llu (%s)", n.what.c_str(), (unsigned long long)n.have,
                             (unsigned long long)n.need, n.why.c_str());
        }
        out += (out.empty() ? "" : "; ") + line;
    }
    return out;
}

std::vector<DeviceFeature> describeFeatures(const DeviceInfo& info) {
    bool api12 = info.api_version >= VK_API_VERSION_1_2;
    return {
        {"vulkan 1.2", api12, "required"},
        {"storage buffer array dynamic indexing", info.dynamic_indexing, "required"},
        {"subgroup ballot (compute)", info.subgroup_ballot,
         "chooses the sequencer variant (" + kernelVariant("sequencer", info) + ")"},
        {"storage buffer array non-uniform indexing", info.nonuniform_indexing,
         "unused: the sequencer reaches pages through a switch on constant indices"},
        {"timeline semaphores", info.timeline, "unused: chains are synchronised with fences"},
        {"shader int64", info.int64, capabilityUse(info, SpvCap::kInt64, "Int64")},
        {"shader float16", info.float16, capabilityUse(info, SpvCap::kFloat16, "Float16")},
        {"shader int8", info.int8, capabilityUse(info, SpvCap::kInt8, "Int8")},
        {"8-bit storage", info.storage8,
         capabilityUse(info, SpvCap::kStorageBuffer8BitAccess, "StorageBuffer8BitAccess")},
        {"integer dot product", info.int_dot,
         info.int_dot && info.int_dot_accelerated
             ? std::string("4 x 8-bit packed signed accelerated: the int8 GEMM (`_tq`) runs prompts and "
                           "large batches of block-type matrices (BLUE_MATMUL_INT8=0 turns it off)")
             : info.int_dot ? std::string("not accelerated: the int8 kernels (`_tq`; CPU drivers: Q4_0's, "
                                          "Q4_K's, Q5_K's and Q6_K's integer SWAR) run only with "
                                          "BLUE_MATMUL_INT8=1")
                            : std::string("without it the int8 GEMM (`_tq`) cannot run")},
        {"conditional rendering", info.conditional_rendering,
         "skips an idle block's dispatches in a cycle (without it every block's dispatches run, "
         "with zero workgroups when no instance asked; off by default on CPU drivers, where it "
         "measured slower; BLUE_CONDITIONAL=1 or 0 decides)"},
    };
}

}  // namespace blue
