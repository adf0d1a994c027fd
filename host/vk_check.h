// Reporting Vulkan failures: BLUE_VK_TRY returns a Status naming the call, the VkResult, and the
// file and line, from any function that returns Status or Result<T>.
#pragma once

#include <volk.h>

#include "vm/status.h"

namespace blue {

const char* vkResultName(VkResult r);
Status vkFailure(const char* call, VkResult r, const char* file, int line);

#define BLUE_VK_TRY(call)                                                          \
    do {                                                                           \
        VkResult blue_vk_r_ = (call);                                              \
        if (blue_vk_r_ != VK_SUCCESS) {                                            \
            return ::blue::vkFailure(#call, blue_vk_r_, __FILE__, __LINE__);       \
        }                                                                          \
    } while (0)

}  // namespace blue
