// Vulkan instance and device setup (see device.h).
#include "host/device.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "host/device_needs.h"
#include "host/device_profile.h"
#include "host/vk_check.h"

namespace blue {

namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

Status initVolk() {
    static VkResult result = volkInitialize();
    if (result != VK_SUCCESS) {
        return Status::error(
            "no Vulkan loader found (libvulkan.so.1); install libvulkan1 and a driver, e.g. "
            "`apt-get install libvulkan1 mesa-vulkan-drivers` for the CPU driver lavapipe");
    }
    return Status::ok();
}

bool envFlag(const char* name) {
    const char* v = std::getenv(name);
    return v && std::strcmp(v, "0") != 0 && *v != '\0';
}

bool layerAvailable(const char* name) {
    uint32_t n = 0;
    vkEnumerateInstanceLayerProperties(&n, nullptr);
    std::vector<VkLayerProperties> layers(n);
    vkEnumerateInstanceLayerProperties(&n, layers.data());
    for (const auto& l : layers) {
        if (std::strcmp(l.layerName, name) == 0) return true;
    }
    return false;
}

// The validation layer's optional checks, chosen by BLUE_VALIDATION (see DeviceOptions).
struct ValidationChecks {
    bool sync = true;
    bool gpu_assisted = false;
    std::string describe() const {
        return std::string("core") + (sync ? ", synchronization" : "") +
               (gpu_assisted ? ", GPU-assisted" : "");
    }
};

ValidationChecks validationChecksFromEnv() {
    ValidationChecks c;
    const char* v = std::getenv("BLUE_VALIDATION");
    std::string mode = v ? v : "";
    if (mode == "core") c.sync = false;
    if (mode == "gpu") c.gpu_assisted = true;
    return c;
}

// The loader loads the drivers for each instance and unloads them with it, and NVIDIA's driver
// cannot be loaded again without end in one process: on an H200 (driver 580.159.04) the 31st
// device in a row failed with VK_ERROR_INCOMPATIBLE_DRIVER, and so did every one after it, with
// or without the validation layer. A process that rebuilds its device (a server after a device
// loss, the C API's engines one after another) would lose the GPU for good. One instance, made
// before the first and kept for the life of the process, holds the drivers loaded.
void keepDriversLoaded() {
    static const bool kept = [] {
        VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
        app.pApplicationName = "BlueVM (keeps the drivers loaded)";
        app.apiVersion = VK_API_VERSION_1_2;
        VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
        ci.pApplicationInfo = &app;
        VkInstance keeper = VK_NULL_HANDLE;
        return vkCreateInstance(&ci, nullptr, &keeper) == VK_SUCCESS;  // never destroyed
    }();
    (void)kept;
}

Result<VkInstance> createInstance(bool validation, const ValidationChecks& checks = {}) {
    BLUE_TRY(initVolk());
    if (volkGetInstanceVersion() < VK_API_VERSION_1_2) {
        return Status::error("the Vulkan loader is older than 1.2; BlueVM needs Vulkan 1.2");
    }
    keepDriversLoaded();
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "BlueVM";
    app.apiVersion = VK_API_VERSION_1_2;
    std::vector<const char*> layers, extensions;
    if (validation) {
        if (!layerAvailable(kValidationLayer)) {
            return Status::error(
                "validation was requested but VK_LAYER_KHRONOS_validation is not installed "
                "(apt-get install vulkan-validationlayers)");
        }
        layers.push_back(kValidationLayer);
        extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    }
    // Synchronization validation finds missing barriers that lavapipe forgives and GPUs do not;
    // GPU-assisted validation instruments shaders to catch out-of-bounds descriptor accesses.
    std::vector<VkValidationFeatureEnableEXT> enables;
    if (validation && checks.sync) {
        enables.push_back(VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT);
    }
    if (validation && checks.gpu_assisted) {
        enables.push_back(VK_VALIDATION_FEATURE_ENABLE_GPU_ASSISTED_EXT);
    }
    VkValidationFeaturesEXT features{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
    features.enabledValidationFeatureCount = uint32_t(enables.size());
    features.pEnabledValidationFeatures = enables.data();
    VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    if (!enables.empty()) ci.pNext = &features;
    ci.pApplicationInfo = &app;
    ci.enabledLayerCount = uint32_t(layers.size());
    ci.ppEnabledLayerNames = layers.data();
    ci.enabledExtensionCount = uint32_t(extensions.size());
    ci.ppEnabledExtensionNames = extensions.data();
    VkInstance instance = VK_NULL_HANDLE;
    VkResult r = vkCreateInstance(&ci, nullptr, &instance);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER) {
        return Status::error(
            "no Vulkan driver found; install one, e.g. `apt-get install "
            "mesa-vulkan-drivers` for the CPU driver lavapipe");
    }
    BLUE_VK_TRY(r);
    volkLoadInstance(instance);
    return instance;
}

const char* typeName(VkPhysicalDeviceType t) {
    switch (t) {
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
            return "discrete GPU";
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
            return "integrated GPU";
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
            return "virtual GPU";
        case VK_PHYSICAL_DEVICE_TYPE_CPU:
            return "CPU";
        default:
            return "other";
    }
}

int typeRank(VkPhysicalDeviceType t) {
    switch (t) {
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
            return 0;
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
            return 1;
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
            return 2;
        case VK_PHYSICAL_DEVICE_TYPE_CPU:
            return 3;
        default:
            return 4;
    }
}

void readLimits(const VkPhysicalDeviceLimits& l, DeviceInfo& info) {
    info.max_storage_buffer_range = l.maxStorageBufferRange;
    info.max_texel_buffer_elements = l.maxTexelBufferElements;
    info.max_allocations = l.maxMemoryAllocationCount;
    for (int i = 0; i < 3; ++i) {
        info.max_workgroup_count[i] = l.maxComputeWorkGroupCount[i];
        info.max_workgroup_size[i] = l.maxComputeWorkGroupSize[i];
    }
    info.max_workgroup_invocations = l.maxComputeWorkGroupInvocations;
    info.max_shared_memory = l.maxComputeSharedMemorySize;
    info.min_storage_offset_alignment = uint32_t(l.minStorageBufferOffsetAlignment);
    info.max_stage_storage_buffers = l.maxPerStageDescriptorStorageBuffers;
    info.max_stage_storage_images = l.maxPerStageDescriptorStorageImages;
    info.max_stage_resources = l.maxPerStageResources;
    info.max_set_storage_buffers = l.maxDescriptorSetStorageBuffers;
    info.max_set_storage_images = l.maxDescriptorSetStorageImages;
    info.max_bound_sets = l.maxBoundDescriptorSets;
    info.max_push_constants = l.maxPushConstantsSize;
}

void readMemory(const VkPhysicalDeviceMemoryProperties& mem, DeviceInfo& info) {
    for (uint32_t h = 0; h < mem.memoryHeapCount; ++h) {
        if (mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
            info.device_local_bytes += mem.memoryHeaps[h].size;
        }
    }
    for (uint32_t t = 0; t < mem.memoryTypeCount; ++t) {
        VkMemoryPropertyFlags fl = mem.memoryTypes[t].propertyFlags;
        if ((fl & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) &&
            (fl & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
            mem.memoryHeaps[mem.memoryTypes[t].heapIndex].size >= info.device_local_bytes / 2) {
            info.unified_memory = true;
        }
    }
}

// The real device's limits and features, before any profile.
bool hasDeviceExtension(VkPhysicalDevice pd, const char* name) {
    uint32_t n = 0;
    vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
    std::vector<VkExtensionProperties> exts(n);
    vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, exts.data());
    for (const VkExtensionProperties& e : exts) {
        if (std::strcmp(e.extensionName, name) == 0) return true;
    }
    return false;
}

DeviceInfo readDevice(VkPhysicalDevice pd, uint32_t index) {
    VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, &driver};
    VkPhysicalDeviceSubgroupProperties sub{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                           &m3};
    // Integer dot products: the extension's structures are chained only where it is offered.
    const bool has_int_dot = hasDeviceExtension(pd, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    VkPhysicalDeviceShaderIntegerDotProductProperties idp{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES};
    if (has_int_dot) {
        idp.pNext = driver.pNext;
        driver.pNext = &idp;
    }
    VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &sub};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    VkPhysicalDeviceShaderIntegerDotProductFeatures idf{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
    VkPhysicalDeviceConditionalRenderingFeaturesEXT cond{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_CONDITIONAL_RENDERING_FEATURES_EXT, has_int_dot ? &idf : nullptr};
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, &cond};
    VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f12};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    VkPhysicalDeviceMemoryProperties mem;
    vkGetPhysicalDeviceMemoryProperties(pd, &mem);

    const VkPhysicalDeviceProperties& p = p2.properties;
    DeviceInfo info;
    info.index = index;
    info.name = p.deviceName;
    info.type = typeName(p.deviceType);
    info.cpu = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    info.driver = std::string(driver.driverName) + " " + driver.driverInfo;
    info.api_version = p.apiVersion;
    info.api = strFormat("%u.%u.%u", VK_API_VERSION_MAJOR(p.apiVersion),
                         VK_API_VERSION_MINOR(p.apiVersion), VK_API_VERSION_PATCH(p.apiVersion));
    readLimits(p.limits, info);
    info.max_allocation = m3.maxMemoryAllocationSize;
    info.subgroup_size = sub.subgroupSize;
    readMemory(mem, info);
    info.subgroup_ballot = (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                           (sub.supportedOperations & VK_SUBGROUP_FEATURE_BALLOT_BIT);
    info.dynamic_indexing = f2.features.shaderStorageBufferArrayDynamicIndexing != 0;
    info.nonuniform_indexing = f12.shaderStorageBufferArrayNonUniformIndexing != 0;
    info.timeline = f12.timelineSemaphore != 0;
    info.int64 = f2.features.shaderInt64 != 0;
    info.float16 = f12.shaderFloat16 != 0;
    info.int8 = f12.shaderInt8 != 0;
    info.storage8 = f12.storageBuffer8BitAccess != 0;
    info.int_dot = has_int_dot && idf.shaderIntegerDotProduct != 0;
    info.int_dot_accelerated = info.int_dot && idp.integerDotProduct4x8BitPackedSignedAccelerated != 0;
    info.conditional_rendering = hasDeviceExtension(pd, VK_EXT_CONDITIONAL_RENDERING_EXTENSION_NAME) &&
                                 cond.conditionalRendering != 0;
    // Used by default on GPUs; on CPU drivers (lavapipe) skipping idle blocks measured slower
    // than dispatching them with zero workgroups. BLUE_CONDITIONAL=1 or 0 decides either way.
    const char* want = std::getenv("BLUE_CONDITIONAL");
    if (want && *want) {
        info.conditional_rendering = info.conditional_rendering && std::string(want) != "0";
    } else if (p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) {
        info.conditional_rendering = false;
    }
    return info;
}

// What BlueVM believes about a device: the real one lowered to the profile (if any), with its
// features described and its unmet needs listed.
DeviceInfo describe(VkPhysicalDevice pd, uint32_t index, const DeviceProfile& profile) {
    DeviceInfo info = readDevice(pd, index);
    if (!profile.name.empty()) applyDeviceProfile(profile, info);
    info.features = describeFeatures(info);
    info.missing = unmetNeeds(info);
    return info;
}

std::vector<VkPhysicalDevice> physicalDevices(VkInstance instance) {
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(instance, &n, nullptr);
    std::vector<VkPhysicalDevice> list(n);
    vkEnumeratePhysicalDevices(instance, &n, list.data());
    return list;
}

bool containsIgnoringCase(const std::string& hay, const std::string& needle) {
    auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(), [](char a, char b) {
        return std::tolower(static_cast<unsigned char>(a)) ==
               std::tolower(static_cast<unsigned char>(b));
    });
    return it != hay.end();
}

// "llvmpipe (...)", or "llvmpipe (...) emulating mali-g610-panvk".
std::string deviceLabel(const DeviceInfo& d) {
    return d.profile.empty() ? d.name : d.name + " emulating " + d.profile;
}

// Picks a device by the selection string or by type preference.
Result<uint32_t> pickDevice(const std::vector<DeviceInfo>& infos,
                            const std::vector<VkPhysicalDeviceType>& types, std::string select) {
    if (infos.empty()) {
        return Status::error(
            "no Vulkan device found; install a driver, e.g. `apt-get install "
            "mesa-vulkan-drivers` for the CPU driver lavapipe");
    }
    if (select.empty()) {
        if (const char* env = std::getenv("BLUE_DEVICE")) select = env;
    }
    if (!select.empty()) {
        bool numeric = std::all_of(select.begin(), select.end(), [](char c) {
            return std::isdigit(static_cast<unsigned char>(c));
        });
        for (const DeviceInfo& d : infos) {
            bool match =
                numeric ? std::to_string(d.index) == select : containsIgnoringCase(d.name, select);
            if (!match) continue;
            if (!d.missing.empty()) {
                return BLUE_ERROR("device %u (%s) lacks what BlueVM needs: %s", d.index,
                                  deviceLabel(d).c_str(), d.missing.c_str());
            }
            return d.index;
        }
        std::string names;
        for (const DeviceInfo& d : infos) names += strFormat("\n  %u: %s", d.index, d.name.c_str());
        return BLUE_ERROR("no Vulkan device matches '%s'; devices:%s", select.c_str(),
                          names.c_str());
    }
    int best = -1;
    for (const DeviceInfo& d : infos) {
        if (!d.missing.empty()) continue;
        if (best < 0 || typeRank(types[d.index]) < typeRank(types[best])) best = int(d.index);
    }
    if (best < 0) {
        return BLUE_ERROR("no Vulkan device has what BlueVM needs (device 0, %s, lacks: %s)",
                          deviceLabel(infos[0]).c_str(), infos[0].missing.c_str());
    }
    return uint32_t(best);
}

}  // namespace

Result<std::vector<DeviceInfo>> listDevices(const std::string& limits) {
    Result<DeviceProfile> profile = profileFromOptions(limits);
    if (!profile) return profile.status();
    Result<VkInstance> instance = createInstance(false);
    if (!instance) return instance.status();
    std::vector<DeviceInfo> infos;
    auto list = physicalDevices(instance.value());
    for (uint32_t i = 0; i < list.size(); ++i)
        infos.push_back(describe(list[i], i, profile.value()));
    vkDestroyInstance(instance.value(), nullptr);
    return infos;
}

namespace {

// BLUE_VALIDATION_LOG=FILE: every validation message is also appended to FILE, one line each, by
// every process that inherits the variable (the test binary sets it, so a message from a server or
// command line it starts, or from a thread no test watches, is still seen and fails the suite).
void appendValidationLog(const char* kind, const char* message) {
    const char* path = std::getenv("BLUE_VALIDATION_LOG");
    if (!path || !*path) return;
    if (FILE* f = std::fopen(path, "a")) {
        std::fprintf(f, "[pid %ld] [validation %s] %s\n", static_cast<long>(getpid()), kind, message);
        std::fclose(f);
    }
}

}  // namespace

VKAPI_ATTR VkBool32 VKAPI_CALL Device::debugCallback(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
    const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
    auto* self = static_cast<Device*>(user);
    // A warning is a finding too: tests fail on it like on an error.
    const char* kind = (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)     ? "error"
                       : (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) ? "warning"
                                                                                      : nullptr;
    if (!kind) return VK_FALSE;
    self->validation_errors_.fetch_add(1);
    std::lock_guard<std::mutex> lock(self->message_mutex_);
    self->last_message_ = data->pMessage;
    if (self->report_validation_) {
        std::fprintf(stderr, "bluevm: [validation %s] %s\n", kind, data->pMessage);
        appendValidationLog(kind, data->pMessage);
    }
    return VK_FALSE;
}

std::string Device::lastValidationMessage() const {
    std::lock_guard<std::mutex> lock(message_mutex_);
    return last_message_;
}

Result<std::unique_ptr<Device>> Device::create(const DeviceOptions& options) {
    Result<DeviceProfile> profile = profileFromOptions(options.limits);
    if (!profile) return profile.status();
    bool validation = options.validation || envFlag("BLUE_VALIDATION");
    ValidationChecks checks = validationChecksFromEnv();
    Result<VkInstance> instance = createInstance(validation, checks);
    if (!instance) return instance.status();
    std::unique_ptr<Device> dev(new Device());
    dev->instance_ = instance.value();
    if (validation) dev->validation_checks_ = checks.describe();
    dev->report_validation_ = options.report_validation;
    if (validation) {
        VkDebugUtilsMessengerCreateInfoEXT mi{
            VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
        mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT |
                             VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT;
        mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
        mi.pfnUserCallback = &Device::debugCallback;
        mi.pUserData = dev.get();
        BLUE_VK_TRY(vkCreateDebugUtilsMessengerEXT(dev->instance_, &mi, nullptr, &dev->messenger_));
    }
    auto list = physicalDevices(dev->instance_);
    std::vector<DeviceInfo> infos;
    std::vector<VkPhysicalDeviceType> types;
    for (uint32_t i = 0; i < list.size(); ++i) {
        infos.push_back(describe(list[i], i, profile.value()));
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(list[i], &p);
        types.push_back(p.deviceType);
    }
    Result<uint32_t> pick = pickDevice(infos, types, options.select);
    if (!pick) return pick.status();
    dev->physical_ = list[pick.value()];
    dev->info_ = infos[pick.value()];
    vkGetPhysicalDeviceProperties(dev->physical_, &dev->props_);
    vkGetPhysicalDeviceMemoryProperties(dev->physical_, &dev->memory_);
    writeClampedLimits(dev->info_, dev->props_, dev->memory_);

    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(dev->physical_, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> families(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(dev->physical_, &nq, families.data());
    dev->queue_family_ = UINT32_MAX;
    for (uint32_t i = 0; i < nq && dev->queue_family_ == UINT32_MAX; ++i) {
        if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) dev->queue_family_ = i;
    }
    if (dev->queue_family_ == UINT32_MAX) {
        return BLUE_ERROR("device %s has no compute queue", dev->info_.name.c_str());
    }
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qi.queueFamilyIndex = dev->queue_family_;
    qi.queueCount = 1;
    qi.pQueuePriorities = &priority;

    // Enable what the (emulated) device has, no more: a kernel that used a feature a profile
    // turned off would then be flagged by the validation layer.
    VkPhysicalDeviceFeatures have{};
    vkGetPhysicalDeviceFeatures(dev->physical_, &have);
    const bool gpu_av = dev->validation_checks_.find("GPU-assisted") != std::string::npos;
    if (gpu_av) {
        // With VK_KHR_shader_integer_dot_product enabled, GPU-assisted validation on lavapipe
        // ran the golden programs (which use no integer dot product) for more than 300 s against
        // 80 s without it. Under GPU-AV the device is taken as not offering it: the int8 GEMM
        // (`_tq`) is then refused, the rest runs as it would.
        dev->info_.int_dot = false;
        dev->info_.int_dot_accelerated = false;
    }
    const DeviceInfo& info = dev->info_;
    VkPhysicalDeviceConditionalRenderingFeaturesEXT cond{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_CONDITIONAL_RENDERING_FEATURES_EXT};
    cond.conditionalRendering = info.conditional_rendering;
    VkPhysicalDeviceShaderIntegerDotProductFeatures idf{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
    idf.shaderIntegerDotProduct = VK_TRUE;
    void* chain = nullptr;  // only the structures of the extensions enabled below
    if (info.int_dot) {
        idf.pNext = chain;
        chain = &idf;
    }
    if (info.conditional_rendering) {
        cond.pNext = chain;
        chain = &cond;
    }
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, chain};
    f12.timelineSemaphore = info.timeline;
    f12.shaderFloat16 = info.float16;
    f12.storageBuffer8BitAccess = info.storage8;
    f12.shaderInt8 = info.int8;
    VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f12};
    f2.features.shaderStorageBufferArrayDynamicIndexing = VK_TRUE;
    f2.features.shaderInt64 = info.int64;
    // Robust access turns an out-of-bounds read into a zero; GPU-assisted validation should see
    // it as the bug it is, so it runs without.
    f2.features.robustBufferAccess = gpu_av ? VK_FALSE : have.robustBufferAccess;

    VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &f2};
    std::vector<const char*> extensions;
    if (info.conditional_rendering) extensions.push_back(VK_EXT_CONDITIONAL_RENDERING_EXTENSION_NAME);
    if (info.int_dot) extensions.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    di.enabledExtensionCount = uint32_t(extensions.size());
    di.ppEnabledExtensionNames = extensions.data();
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    BLUE_VK_TRY(vkCreateDevice(dev->physical_, &di, nullptr, &dev->device_));
    volkLoadDevice(dev->device_);
    vkGetDeviceQueue(dev->device_, dev->queue_family_, 0, &dev->queue_);
    return dev;
}

Device::~Device() {
    if (device_) {
        vkDeviceWaitIdle(device_);
        vkDestroyDevice(device_, nullptr);
    }
    if (messenger_) vkDestroyDebugUtilsMessengerEXT(instance_, messenger_, nullptr);
    if (instance_) vkDestroyInstance(instance_, nullptr);
}

}  // namespace blue
