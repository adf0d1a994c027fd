// The Vulkan device BlueVM runs on: instance creation (through volk), device selection, the
// features BlueVM needs, and the Khronos validation layer, whose errors are counted so tests can
// fail on any of them.
#pragma once

#include <volk.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "vm/status.h"

namespace blue {

struct DeviceOptions {
    // Device to use: an index from `bluevm devices`, or a case-insensitive part of its name.
    // Empty: the BLUE_DEVICE environment variable, else discrete > integrated > virtual > CPU.
    std::string select;
    // Enable VK_LAYER_KHRONOS_validation (also when the BLUE_VALIDATION environment variable is
    // set and not 0). Which checks run is validationChecks(): core and synchronization validation
    // by default; BLUE_VALIDATION=core drops synchronization validation, BLUE_VALIDATION=gpu adds
    // GPU-assisted validation (out-of-bounds descriptor access, instrumented shaders; slow).
    bool validation = false;
    // Print validation messages to stderr and append them to BLUE_VALIDATION_LOG's file. Off only
    // where messages are provoked on purpose (the test that proves synchronization validation
    // runs); they are counted either way (validationErrors()).
    bool report_validation = true;
    // Emulate a smaller device (`--device-limits`): a built-in profile name (`bluevm devices
    // --profiles` lists them) or the path of a profile file (host/device_profiles/README.md).
    // Its limits clamp the real device's and its features can only be turned off. Empty: the
    // BLUE_DEVICE_LIMITS environment variable, else none.
    std::string limits;
};

// One optional or required Vulkan feature, as `bluevm devices` prints it.
struct DeviceFeature {
    std::string name;
    bool supported = false;
    std::string use;  // what BlueVM does with it, e.g. "required" or "unused by the kernels"
};

// What BlueVM knows about one physical device: every limit and feature it reads, after an
// emulated profile (DeviceOptions::limits) has clamped them. Code that depends on a limit reads
// it here (or through Device's accessors), never from the raw VkPhysicalDeviceProperties.
struct DeviceInfo {
    uint32_t index = 0;
    std::string name, type, driver, api;
    uint32_t api_version = 0;                // VK_MAKE_API_VERSION of the device
    uint64_t device_local_bytes = 0;         // sum of the DEVICE_LOCAL heaps
    uint64_t max_storage_buffer_range = 0;   // maxStorageBufferRange
    uint64_t max_texel_buffer_elements = 0;  // maxTexelBufferElements
    uint64_t max_allocation = 0;             // maxMemoryAllocationSize
    uint32_t max_allocations = 0;            // maxMemoryAllocationCount (live allocations)
    uint32_t max_workgroup_count[3] = {0, 0, 0};
    uint32_t max_workgroup_size[3] = {0, 0, 0};
    uint32_t max_workgroup_invocations = 0;
    uint32_t max_shared_memory = 0;  // maxComputeSharedMemorySize
    uint32_t subgroup_size = 0;
    uint32_t min_storage_offset_alignment = 0;
    uint32_t max_stage_storage_buffers = 0;  // maxPerStageDescriptorStorageBuffers
    uint32_t max_stage_storage_images = 0;   // ...StorageImages (storage texel buffers count here)
    uint32_t max_stage_resources = 0;        // maxPerStageResources
    uint32_t max_set_storage_buffers = 0;    // maxDescriptorSetStorageBuffers
    uint32_t max_set_storage_images = 0;     // maxDescriptorSetStorageImages
    uint32_t max_bound_sets = 0;             // maxBoundDescriptorSets
    uint32_t max_push_constants = 0;         // maxPushConstantsSize (bytes)
    bool unified_memory = false;             // device-local memory the host can map
    bool cpu = false;                        // a CPU driver (VK_PHYSICAL_DEVICE_TYPE_CPU: lavapipe)
    // Features (Vulkan names in comments).
    bool dynamic_indexing = false;     // shaderStorageBufferArrayDynamicIndexing
    bool nonuniform_indexing = false;  // shaderStorageBufferArrayNonUniformIndexing
    bool subgroup_ballot = false;      // VK_SUBGROUP_FEATURE_BALLOT_BIT in compute
    bool timeline = false;             // timelineSemaphore
    bool int64 = false;                // shaderInt64
    bool float16 = false;              // shaderFloat16
    bool int8 = false;                 // shaderInt8
    bool storage8 = false;             // storageBuffer8BitAccess
    // VK_KHR_shader_integer_dot_product: shaderIntegerDotProduct, and whether the device says the
    // packed 4 x 8-bit signed dot product is fast (integerDotProduct4x8BitPackedSignedAccelerated);
    // the int8 GEMM (`_tq`) runs by default only where it is (KernelChoice::int8_matmul).
    bool int_dot = false;
    bool int_dot_accelerated = false;
    bool conditional_rendering = false;  // VK_EXT_conditional_rendering (conditionalRendering)
    std::string profile;               // the emulated profile (empty: the real device)
    std::vector<std::string>
        clamped;  // what the profile changed, e.g. "maxStorageBufferRange 4294967295 -> 134217728"
    std::vector<DeviceFeature> features;  // every feature above, with what BlueVM uses it for
    std::string missing;  // what BlueVM needs and the device lacks, with numbers (empty: usable)
};

// Lists every Vulkan physical device (creates and destroys a temporary instance), as seen through
// the profile `limits` names (empty: BLUE_DEVICE_LIMITS, else none). Fails when there is no
// Vulkan loader or driver, or the profile cannot be loaded.
Result<std::vector<DeviceInfo>> listDevices(const std::string& limits = "");

class Device {
public:
    ~Device();
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    // Creates the instance and the logical device. Fails with a clear message when there is no
    // Vulkan loader or driver, no usable device (naming what it lacks, with the numbers), the
    // selection matches nothing, or the limits profile cannot be loaded. Only the features the
    // (emulated) device has are enabled, so the validation layer flags a kernel that uses more.
    static Result<std::unique_ptr<Device>> create(const DeviceOptions& options);

    VkInstance instance() const { return instance_; }
    VkPhysicalDevice physical() const { return physical_; }
    VkDevice device() const { return device_; }
    VkQueue queue() const { return queue_; }
    uint32_t queueFamily() const { return queue_family_; }
    // Properties and memory heaps with the emulated profile's limits written in (pipeline cache
    // UUID, timestamp period and memory types stay the real device's).
    const VkPhysicalDeviceProperties& props() const { return props_; }
    const VkPhysicalDeviceMemoryProperties& memory() const { return memory_; }
    // Whether the device has host-visible memory that is not device-local (a discrete GPU's
    // system RAM); unified-memory devices such as lavapipe have none.
    bool hasHostOnlyMemory() const {
        for (uint32_t i = 0; i < memory_.memoryTypeCount; ++i) {
            const VkMemoryPropertyFlags f = memory_.memoryTypes[i].propertyFlags;
            if ((f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && !(f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) return true;
        }
        return false;
    }
    const DeviceInfo& info() const { return info_; }
    // Largest buffer BlueVM binds whole (VK_WHOLE_SIZE): within one storage binding's range and
    // one allocation (every buffer has its own).
    uint64_t maxBindingBytes() const {
        return std::min(info_.max_storage_buffer_range, maxAllocationBytes());
    }
    // Largest page: a storage binding, and a texel view of 16-byte texels, must both cover it.
    uint64_t maxPageBytes() const {
        return std::min(info_.max_storage_buffer_range, info_.max_texel_buffer_elements * 16);
    }
    // Largest page of the memory plan (planPages): a page, one allocation, and under the 4 GiB a
    // 32-bit byte offset reaches; a tensor larger than this cannot be placed.
    uint64_t maxPlanPageBytes() const {
        return std::min<uint64_t>({maxPageBytes(), maxAllocationBytes(), 0xFFFFFF00ull});
    }
    // Largest allocation: maxMemoryAllocationSize, and never more than the device-local heaps.
    uint64_t maxAllocationBytes() const {
        return std::min(info_.max_allocation, info_.device_local_bytes);
    }

    // Memory allocations live on this device, counted against DeviceInfo::max_allocations
    // (maxMemoryAllocationCount, 4096 on many drivers) by host/buffer.cpp: reserveAllocation
    // takes one before vkAllocateMemory (false, nothing taken, when all are in use; *live then
    // holds how many), releaseAllocation gives it back when the memory is freed or not allocated.
    bool reserveAllocation(uint32_t* live) {
        *live = allocations_.fetch_add(1);
        if (*live < info_.max_allocations) return true;
        allocations_.fetch_sub(1);
        return false;
    }
    void releaseAllocation() { allocations_.fetch_sub(1); }
    uint32_t allocations() const { return allocations_.load(); }

    // Validation-layer errors and warnings seen since creation (0 when validation is off).
    uint32_t validationErrors() const { return validation_errors_.load(); }
    bool validationEnabled() const { return messenger_ != VK_NULL_HANDLE; }
    // The validation checks enabled, e.g. "core, synchronization" (empty when off).
    const std::string& validationChecks() const { return validation_checks_; }
    std::string lastValidationMessage() const;

    // ---- device loss (host/vk_check.h) ----
    // Marks the device lost: a call on it returned VK_ERROR_DEVICE_LOST. Sticky, as on hardware:
    // work on a lost device fails fast with lostReason() instead of touching its objects; they can
    // still be destroyed, and the device too. `why` names the call (vkFailure's message).
    void markLost(const std::string& why) {
        std::lock_guard<std::mutex> lock(message_mutex_);
        if (!lost_) lost_reason_ = why;
        lost_ = true;
    }
    bool lost() const { return lost_.load(); }
    std::string lostReason() const {
        std::lock_guard<std::mutex> lock(message_mutex_);
        return lost_reason_;
    }

private:
    Device() = default;
    static VKAPI_ATTR VkBool32 VKAPI_CALL debugCallback(
        VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT type,
        const VkDebugUtilsMessengerCallbackDataEXT* data, void* user);

    VkInstance instance_ = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
    VkPhysicalDevice physical_ = VK_NULL_HANDLE;
    VkDevice device_ = VK_NULL_HANDLE;
    VkQueue queue_ = VK_NULL_HANDLE;
    uint32_t queue_family_ = 0;
    VkPhysicalDeviceProperties props_{};
    VkPhysicalDeviceMemoryProperties memory_{};
    DeviceInfo info_;
    std::string validation_checks_;
    std::atomic<uint32_t> validation_errors_{0};
    std::atomic<uint32_t> allocations_{0};
    bool report_validation_ = true;
    mutable std::mutex message_mutex_;
    std::string last_message_;
    std::atomic<bool> lost_{false};  // device loss: see markLost
    std::string lost_reason_;        // guarded by message_mutex_
};

}  // namespace blue
