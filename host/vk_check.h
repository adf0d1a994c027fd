// Checked Vulkan calls: BLUE_VK_TRY returns a Status naming the call, the VkResult, and the file
// and line, from any function that returns Status or Result<T>. Device loss and
// out-of-device-memory read "device lost (VK_ERROR_DEVICE_LOST from vkQueueSubmit at
// host/machine.cpp:344)", so callers only add what was running.
//
// Fault injection: every checked call first passes one fault point, which counts it and can make
// it fail without calling Vulkan, as a lost device or an exhausted heap would. Tests arm it with
// faultInject(); processes with the environment variable BLUE_FAULT, read at start:
//
//   BLUE_FAULT=device_lost@120            the 120th checked call of the process fails
//   BLUE_FAULT=oom@vkAllocateMemory:3     the 3rd vkAllocateMemory fails (out of device memory)
//   BLUE_FAULT=device_lost@120+           that call and every later one fail (recovery never works)
//   BLUE_FAULT=trace                      print every checked call with its number on stderr
//
// Kinds: device_lost, oom (VK_ERROR_OUT_OF_DEVICE_MEMORY), host_oom (VK_ERROR_OUT_OF_HOST_MEMORY);
// items combine with commas ("trace,device_lost@120"). A failed call creates nothing, so no
// object leaks; what it leaves in flight (a skipped fence wait) is waited for at destruction.
#pragma once

#include <volk.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "vm/status.h"

namespace blue {

const char* vkResultName(VkResult r);
// Builds the failure Status of a checked call (and records it as the calling thread's last
// failure, see lastVkFailure). `call` may be the call's text; the message names its function.
Status vkFailure(const char* call, VkResult r, const char* file, int line);

// The calling thread's last failed checked call (since clearVkFailure): callers clear it before
// an operation and read it after the operation failed, to tell device loss from other errors.
struct VkFailure {
    VkResult result = VK_SUCCESS;  // VK_SUCCESS: none
    std::string call;              // the function, e.g. "vkQueueSubmit"
    std::string where;             // "host/machine.cpp:344"
    std::string message;           // vkFailure's message
};
VkFailure lastVkFailure();
void clearVkFailure();

// Results after which the device and everything on it must be rebuilt (serving does so).
inline bool vkFatal(VkResult r) {
    return r == VK_ERROR_DEVICE_LOST || r == VK_ERROR_OUT_OF_DEVICE_MEMORY;
}

// ---- fault injection ----------------------------------------------------------------------

inline constexpr uint64_t kFaultForever = UINT64_MAX;

struct FaultPlan {
    VkResult result = VK_ERROR_DEVICE_LOST;
    // Without `call`: the at-th checked call after arming fails (1: the next one). With `call`
    // (a function name, e.g. "vkQueueSubmit"): the at-th call of that function after arming.
    uint64_t at = 1;
    std::string call;
    uint64_t count = 1;  // consecutive matching calls that fail; kFaultForever: all from `at` on
};

// What fired: the call that was made to fail.
struct FaultHit {
    uint64_t index = 0;  // its number in faultCallCount()'s count (0: nothing fired yet)
    VkResult result = VK_SUCCESS;
    std::string call;   // function name
    std::string where;  // "host/machine.cpp:344"
};

// Arms a fault (replacing any armed one). Thread-safe.
void faultInject(const FaultPlan& plan);
void faultClear();
// Checked calls made so far by the whole process (every thread), fault or not.
uint64_t faultCallCount();
// Faults fired so far, and the last one.
uint64_t faultHits();
FaultHit faultLastHit();
// Parses a BLUE_FAULT value (see above) and arms it; also used by the process at start.
Status faultConfigure(const std::string& spec);

// The fault point every checked call passes: counts the call; returns the injected result
// (the call must then not be made) or VK_SUCCESS.
VkResult vkFaultPoint(const char* call, const char* file, int line);

// Runs a Vulkan call through the fault point and yields its VkResult (for calls whose result is
// handled by hand).
#define BLUE_VK_CALL(call)                                                     \
    [&]() -> VkResult {                                                        \
        VkResult blue_vk_f_ = ::blue::vkFaultPoint(#call, __FILE__, __LINE__); \
        return blue_vk_f_ != VK_SUCCESS ? blue_vk_f_ : VkResult(call);         \
    }()

// A checked call: fails the enclosing function with vkFailure's Status. A result already in a
// variable (BLUE_VK_TRY(r)) is checked without a fault point: its call was already made.
#define BLUE_VK_TRY(call)                                                    \
    do {                                                                     \
        VkResult blue_vk_r_ = VK_SUCCESS;                                    \
        if constexpr (std::is_lvalue_reference_v<decltype((call))>) {        \
            blue_vk_r_ = (call);                                             \
        } else {                                                             \
            blue_vk_r_ = BLUE_VK_CALL(call);                                 \
        }                                                                    \
        if (blue_vk_r_ != VK_SUCCESS) {                                      \
            return ::blue::vkFailure(#call, blue_vk_r_, __FILE__, __LINE__); \
        }                                                                    \
    } while (0)

// BLUE_VK_TRY for a call on Device `dev`: a VK_ERROR_DEVICE_LOST also marks `dev` lost (sticky;
// see Device::markLost), so later work on it fails fast.
#define BLUE_VK_TRY_ON(dev, call)                                                                 \
    do {                                                                                          \
        VkResult blue_vk_r_ = BLUE_VK_CALL(call);                                                 \
        if (blue_vk_r_ != VK_SUCCESS) {                                                           \
            ::blue::Status blue_vk_s_ = ::blue::vkFailure(#call, blue_vk_r_, __FILE__, __LINE__); \
            if (blue_vk_r_ == VK_ERROR_DEVICE_LOST) (dev).markLost(blue_vk_s_.message());         \
            return blue_vk_s_;                                                                    \
        }                                                                                         \
    } while (0)

}  // namespace blue
