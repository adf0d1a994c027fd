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
};

// What `bluevm devices` prints about one physical device.
struct DeviceInfo {
    uint32_t index = 0;
    std::string name, type, driver, api;
    uint64_t device_local_bytes = 0;
    uint64_t max_storage_buffer_range = 0;
    uint64_t max_texel_buffer_elements = 0;
    uint64_t max_allocation = 0;
    uint32_t max_workgroup_count[3] = {0, 0, 0};
    uint32_t max_workgroup_invocations = 0;
    uint32_t subgroup_size = 0;
    uint32_t min_storage_offset_alignment = 0;
    bool unified_memory = false;  // device-local memory the host can map
    std::vector<std::pair<std::string, bool>> features;  // name, supported
    std::string missing;  // required features it lacks (empty: usable)
};

// Lists every Vulkan physical device (creates and destroys a temporary instance).
Result<std::vector<DeviceInfo>> listDevices();

class Device {
public:
    ~Device();
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    // Creates the instance and the logical device. Fails with a clear message when there is no
    // Vulkan loader or driver, no usable device, or the selection matches nothing.
    static Result<std::unique_ptr<Device>> create(const DeviceOptions& options);

    VkInstance instance() const { return instance_; }
    VkPhysicalDevice physical() const { return physical_; }
    VkDevice device() const { return device_; }
    VkQueue queue() const { return queue_; }
    uint32_t queueFamily() const { return queue_family_; }
    const VkPhysicalDeviceProperties& props() const { return props_; }
    const VkPhysicalDeviceMemoryProperties& memory() const { return memory_; }
    const DeviceInfo& info() const { return info_; }
    // Largest range one storage-buffer binding may cover.
    uint64_t maxBindingBytes() const { return info_.max_storage_buffer_range; }
    // Largest page: a storage binding, and a texel view of 16-byte texels, must both cover it.
    uint64_t maxPageBytes() const {
        return std::min(info_.max_storage_buffer_range, info_.max_texel_buffer_elements * 16);
    }
    uint64_t maxAllocationBytes() const { return info_.max_allocation; }

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
    mutable std::mutex message_mutex_;
    std::string last_message_;
    std::atomic<bool> lost_{false};  // device loss: see markLost
    std::string lost_reason_;        // guarded by message_mutex_
};

}  // namespace blue
