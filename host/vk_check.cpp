// VkResult names for error messages.
#include "host/vk_check.h"

namespace blue {

const char* vkResultName(VkResult r) {
    switch (r) {
#define BLUE_VK_RESULT(name) \
    case name: return #name;
        BLUE_VK_RESULT(VK_SUCCESS)
        BLUE_VK_RESULT(VK_NOT_READY)
        BLUE_VK_RESULT(VK_TIMEOUT)
        BLUE_VK_RESULT(VK_INCOMPLETE)
        BLUE_VK_RESULT(VK_ERROR_OUT_OF_HOST_MEMORY)
        BLUE_VK_RESULT(VK_ERROR_OUT_OF_DEVICE_MEMORY)
        BLUE_VK_RESULT(VK_ERROR_INITIALIZATION_FAILED)
        BLUE_VK_RESULT(VK_ERROR_DEVICE_LOST)
        BLUE_VK_RESULT(VK_ERROR_MEMORY_MAP_FAILED)
        BLUE_VK_RESULT(VK_ERROR_LAYER_NOT_PRESENT)
        BLUE_VK_RESULT(VK_ERROR_EXTENSION_NOT_PRESENT)
        BLUE_VK_RESULT(VK_ERROR_FEATURE_NOT_PRESENT)
        BLUE_VK_RESULT(VK_ERROR_INCOMPATIBLE_DRIVER)
        BLUE_VK_RESULT(VK_ERROR_TOO_MANY_OBJECTS)
        BLUE_VK_RESULT(VK_ERROR_FORMAT_NOT_SUPPORTED)
        BLUE_VK_RESULT(VK_ERROR_FRAGMENTED_POOL)
        BLUE_VK_RESULT(VK_ERROR_UNKNOWN)
        BLUE_VK_RESULT(VK_ERROR_OUT_OF_POOL_MEMORY)
#undef BLUE_VK_RESULT
        default: return "VkResult(unknown)";
    }
}

Status vkFailure(const char* call, VkResult r, const char* file, int line) {
    return BLUE_ERROR("Vulkan call %s failed with %s (%d) at %s:%d", call, vkResultName(r), int(r),
                      file, line);
}

}  // namespace blue
