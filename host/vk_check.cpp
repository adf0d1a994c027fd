// Vulkan failure messages and the fault-injection point (see vk_check.h).
#include "host/vk_check.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace blue {

namespace {

// "host/machine.cpp" for a __FILE__ inside the source tree: the tree is where this file's own
// __FILE__ ends in "host/vk_check.cpp".
std::string sourcePath(const char* file) {
    static const std::string root = [] {
        std::string self = __FILE__;
        const std::string tail = "host/vk_check.cpp";
        return self.size() >= tail.size() &&
                       self.compare(self.size() - tail.size(), tail.size(), tail) == 0
                   ? self.substr(0, self.size() - tail.size())
                   : std::string();
    }();
    std::string f = file;
    return !root.empty() && f.compare(0, root.size(), root) == 0 ? f.substr(root.size()) : f;
}

// "vkQueueSubmit" from "vkQueueSubmit(dev.queue(), 1, &si, fence)".
std::string functionName(const char* call) {
    const char* paren = std::strchr(call, '(');
    return paren ? std::string(call, size_t(paren - call)) : std::string(call);
}

thread_local VkFailure t_last_failure;

// The armed fault and what fired, under g_mutex; g_armed lets unarmed calls skip the lock.
std::atomic<uint64_t> g_calls{0};
std::atomic<bool> g_armed{false};
std::atomic<bool> g_trace{false};
std::atomic<uint64_t> g_hits{0};
std::mutex g_mutex;
FaultPlan g_plan;
uint64_t g_base = 0;     // g_calls when armed
uint64_t g_matched = 0;  // calls of g_plan.call since armed
FaultHit g_last_hit;

bool parseKind(const std::string& s, VkResult* out) {
    if (s == "device_lost") {
        *out = VK_ERROR_DEVICE_LOST;
    } else if (s == "oom" || s == "out_of_device_memory") {
        *out = VK_ERROR_OUT_OF_DEVICE_MEMORY;
    } else if (s == "host_oom" || s == "out_of_host_memory") {
        *out = VK_ERROR_OUT_OF_HOST_MEMORY;
    } else {
        return false;
    }
    return true;
}

bool parseCount(const std::string& s, uint64_t* out) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = std::strtoull(s.c_str(), nullptr, 10);
    return *out > 0;
}

// BLUE_FAULT is read once, before main.
[[maybe_unused]] const bool g_env_read = [] {
    const char* v = std::getenv("BLUE_FAULT");
    if (!v || !*v) return true;
    Status s = faultConfigure(v);
    if (!s) std::fprintf(stderr, "bluevm: BLUE_FAULT ignored: %s\n", s.message().c_str());
    return true;
}();

}  // namespace

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
        BLUE_VK_RESULT(VK_ERROR_FRAGMENTATION)
        BLUE_VK_RESULT(VK_PIPELINE_COMPILE_REQUIRED)
#undef BLUE_VK_RESULT
        default: return "VkResult(unknown)";
    }
}

Status vkFailure(const char* call, VkResult r, const char* file, int line) {
    VkFailure f;
    f.result = r;
    f.call = functionName(call);
    f.where = strFormat("%s:%d", sourcePath(file).c_str(), line);
    if (r == VK_ERROR_DEVICE_LOST) {
        f.message = strFormat("device lost (%s from %s at %s)", vkResultName(r), f.call.c_str(),
                              f.where.c_str());
    } else if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY) {
        f.message = strFormat("out of device memory (%s from %s at %s)", vkResultName(r),
                              f.call.c_str(), f.where.c_str());
    } else {
        f.message = strFormat("Vulkan call %s failed with %s (%d) at %s", f.call.c_str(),
                              vkResultName(r), int(r), f.where.c_str());
    }
    Status s = Status::error(f.message);
    t_last_failure = std::move(f);
    return s;
}

VkFailure lastVkFailure() {
    return t_last_failure;
}
void clearVkFailure() {
    t_last_failure = VkFailure{};
}

void faultInject(const FaultPlan& plan) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_plan = plan;
    g_base = g_calls.load();
    g_matched = 0;
    g_armed = plan.count > 0 && plan.at > 0;
}

void faultClear() {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_armed = false;
}

uint64_t faultCallCount() {
    return g_calls.load();
}
uint64_t faultHits() {
    return g_hits.load();
}

FaultHit faultLastHit() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_last_hit;
}

Status faultConfigure(const std::string& spec) {
    size_t start = 0;
    while (start <= spec.size()) {
        size_t comma = spec.find(',', start);
        std::string item =
            spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        start = comma == std::string::npos ? spec.size() + 1 : comma + 1;
        if (item.empty()) continue;
        if (item == "trace") {
            g_trace = true;
            continue;
        }
        FaultPlan plan;
        size_t at = item.find('@');
        if (at == std::string::npos || !parseKind(item.substr(0, at), &plan.result)) {
            return BLUE_ERROR(
                "'%s': expected KIND@N, KIND@N+, KIND@vkFunction:N or trace, with "
                "KIND device_lost, oom or host_oom",
                item.c_str());
        }
        std::string where = item.substr(at + 1);
        if (!where.empty() && where.back() == '+') {
            plan.count = kFaultForever;
            where.pop_back();
        }
        if (size_t colon = where.find(':'); colon != std::string::npos) {
            plan.call = where.substr(0, colon);
            where = where.substr(colon + 1);
        }
        if (!parseCount(where, &plan.at) || (!plan.call.empty() && plan.call.rfind("vk", 0) != 0)) {
            return BLUE_ERROR("'%s': expected a call number from 1, or vkFunction:N", item.c_str());
        }
        faultInject(plan);
    }
    return Status::ok();
}

VkResult vkFaultPoint(const char* call, const char* file, int line) {
    const uint64_t n = g_calls.fetch_add(1, std::memory_order_relaxed) + 1;
    if (g_trace.load(std::memory_order_relaxed)) {
        std::fprintf(stderr, "bluevm: checked Vulkan call %llu: %s at %s:%d\n",
                     (unsigned long long)n, functionName(call).c_str(), sourcePath(file).c_str(),
                     line);
    }
    if (!g_armed.load(std::memory_order_acquire)) return VK_SUCCESS;
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_armed) return VK_SUCCESS;
    uint64_t k;  // this call's number among those the plan counts
    if (g_plan.call.empty()) {
        k = n - g_base;
    } else {
        if (functionName(call) != g_plan.call) return VK_SUCCESS;
        k = ++g_matched;
    }
    if (k < g_plan.at || k - g_plan.at >= g_plan.count) return VK_SUCCESS;
    if (g_plan.count != kFaultForever && k - g_plan.at + 1 == g_plan.count) g_armed = false;
    g_last_hit = FaultHit{n, g_plan.result, functionName(call),
                          strFormat("%s:%d", sourcePath(file).c_str(), line)};
    g_hits.fetch_add(1);
    return g_plan.result;
}

}  // namespace blue
