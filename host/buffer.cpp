// Buffer creation and transfers (see buffer.h).
#include "host/buffer.h"

#include <cstring>

#include "host/vk_check.h"

namespace blue {

namespace {

// The first memory type allowed by `type_bits` that has every flag of `want` and none of `avoid`.
int findMemoryType(const Device& dev, uint32_t type_bits, VkMemoryPropertyFlags want,
                   VkMemoryPropertyFlags avoid) {
    const VkPhysicalDeviceMemoryProperties& mem = dev.memory();
    for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
        const VkMemoryPropertyFlags f = mem.memoryTypes[i].propertyFlags;
        if ((type_bits & (1u << i)) && (f & want) == want && !(f & avoid)) return int(i);
    }
    return -1;
}

struct MemPreference {
    VkMemoryPropertyFlags want = 0, avoid = 0;
};

// Memory property preferences per kind, best first.
std::vector<MemPreference> preferences(MemKind kind) {
    const VkMemoryPropertyFlags local = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    switch (kind) {
        case MemKind::DEVICE: return {{local | host, 0}, {local, 0}};
        case MemKind::SHARED: return {{host | VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0}, {host, 0}};
        case MemKind::STAGING: return {{host, 0}};
        // Unified-memory devices (lavapipe, integrated GPUs) have only device-local types.
        case MemKind::HOST: return {{host, local}, {host, 0}};
    }
    return {};
}

// Fails when `dev` was lost earlier: nothing more may run on it.
Status checkNotLost(const Device& dev) {
    if (!dev.lost()) return Status::ok();
    return Status::error("the device was lost earlier (" + dev.lostReason() +
                         "); nothing more runs on it");
}

// Records and submits one copy; on success the copy is queued.
Status submitCopy(Device& dev, VkCommandBuffer cb, VkBuffer src, VkDeviceSize src_off, VkBuffer dst,
                  VkDeviceSize dst_off, VkDeviceSize size) {
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    BLUE_VK_TRY_ON(dev, vkBeginCommandBuffer(cb, &bi));
    VkBufferCopy region{src_off, dst_off, size};
    vkCmdCopyBuffer(cb, src, dst, 1, &region);
    // The copy's write is made visible to the host, to shaders and to later copies (a later
    // submission that reads what this one wrote, or writes what it read: a queue wait on the
    // host is no dependency between the two for the device).
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT | VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                             VK_PIPELINE_STAGE_TRANSFER_BIT,
                         0, 1, &mb, 0, nullptr, 0, nullptr);
    BLUE_VK_TRY_ON(dev, vkEndCommandBuffer(cb));
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    BLUE_VK_TRY_ON(dev, vkQueueSubmit(dev.queue(), 1, &si, VK_NULL_HANDLE));
    return Status::ok();
}

// Runs one transfer command buffer to completion. When the wait fails the copy may still run:
// the device is drained before the command pool goes (a no-op wait on a really lost device).
Status runTransfer(Device& dev, VkBuffer src, VkDeviceSize src_off, VkBuffer dst, VkDeviceSize dst_off,
                   VkDeviceSize size) {
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = dev.queueFamily();
    pi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    VkCommandPool pool;
    BLUE_VK_TRY_ON(dev, vkCreateCommandPool(dev.device(), &pi, nullptr, &pool));
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cb;
    Status s = [&]() -> Status {
        BLUE_VK_TRY_ON(dev, vkAllocateCommandBuffers(dev.device(), &ai, &cb));
        BLUE_TRY(submitCopy(dev, cb, src, src_off, dst, dst_off, size));
        BLUE_VK_TRY_ON(dev, vkQueueWaitIdle(dev.queue()));
        return Status::ok();
    }();
    if (!s) vkDeviceWaitIdle(dev.device());
    vkDestroyCommandPool(dev.device(), pool, nullptr);
    return s;
}

// Allocates memory of the best kind the device has for `b`, binds and (host-visible) maps it.
Status bindMemory(Device& dev, MemKind kind, Buffer* b) {
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev.device(), b->buffer, &req);
    // maxMemoryAllocationCount: past it vkAllocateMemory may fail or, on some drivers, succeed
    // and misbehave; refuse with the numbers instead. The count is reserved before the call, so
    // threads allocating at once cannot pass it together.
    uint32_t live = 0;
    if (!dev.reserveAllocation(&live)) {
        return BLUE_ERROR("the device allows %u memory allocations at once (maxMemoryAllocationCount) and %u are in "
                          "use",
                          dev.info().max_allocations, live);
    }
    Status failed = Status::error("no memory type fits");
    VkMemoryPropertyFlags got = 0;
    for (const MemPreference& pref : preferences(kind)) {
        int type = findMemoryType(dev, req.memoryTypeBits, pref.want, pref.avoid);
        if (type < 0) continue;
        VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
        ai.allocationSize = req.size;
        ai.memoryTypeIndex = uint32_t(type);
        const int line = __LINE__ + 1;  // the call's, for the message
        VkResult r = BLUE_VK_CALL(vkAllocateMemory(dev.device(), &ai, nullptr, &b->memory));
        if (r == VK_SUCCESS) {
            got = dev.memory().memoryTypes[type].propertyFlags;
            failed = Status::ok();
            break;
        }
        b->memory = VK_NULL_HANDLE;
        failed = vkFailure("vkAllocateMemory", r, __FILE__, line);
        if (r == VK_ERROR_DEVICE_LOST) {
            dev.markLost(failed.message());
            break;
        }
        // Out of this kind of memory: the next preference may have room.
    }
    if (!failed) {
        dev.releaseAllocation();
        return failed;
    }
    BLUE_VK_TRY_ON(dev, vkBindBufferMemory(dev.device(), b->buffer, b->memory, 0));
    if (got & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
        BLUE_VK_TRY_ON(dev, vkMapMemory(dev.device(), b->memory, 0, VK_WHOLE_SIZE, 0, &b->mapped));
        if (!(got & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
            vkUnmapMemory(dev.device(), b->memory);  // keep to coherent mappings only
            b->mapped = nullptr;
        }
    }
    return Status::ok();
}

}  // namespace

Result<Buffer> createBuffer(Device& dev, VkDeviceSize size, VkBufferUsageFlags usage, MemKind kind,
                            const char* purpose) {
    BLUE_TRY(checkNotLost(dev));
    Buffer b;
    b.size = (size + 15) & ~VkDeviceSize(15);
    if (b.size == 0) b.size = 16;
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = b.size;
    bi.usage = usage | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    BLUE_VK_TRY_ON(dev, vkCreateBuffer(dev.device(), &bi, nullptr, &b.buffer));
    Status s = bindMemory(dev, kind, &b);
    if (!s) {
        destroyBuffer(dev, b);
        return s.prefix(strFormat("cannot allocate %.1f MiB of GPU memory for %s",
                                  double(b.size) / (1 << 20), purpose));
    }
    return b;
}

void destroyBuffer(Device& dev, Buffer& b) {
    if (b.buffer) vkDestroyBuffer(dev.device(), b.buffer, nullptr);
    if (b.memory) {
        vkFreeMemory(dev.device(), b.memory, nullptr);
        dev.releaseAllocation();
    }
    b = Buffer{};
}

Status uploadToBuffer(Device& dev, Buffer& dst, VkDeviceSize offset, const void* data, VkDeviceSize size) {
    if (size == 0) return Status::ok();
    BLUE_TRY(checkNotLost(dev));
    if (dst.mapped) {
        std::memcpy(static_cast<uint8_t*>(dst.mapped) + offset, data, size);
        return Status::ok();
    }
    constexpr VkDeviceSize kChunk = 64ull << 20;
    Result<Buffer> staging = createBuffer(dev, std::min(size, kChunk), 0, MemKind::STAGING, "upload staging");
    if (!staging) return staging.status();
    Status s;
    for (VkDeviceSize done = 0; done < size && s; done += kChunk) {
        VkDeviceSize n = std::min(kChunk, size - done);
        std::memcpy(staging->mapped, static_cast<const uint8_t*>(data) + done, n);
        s = runTransfer(dev, staging->buffer, 0, dst.buffer, offset + done, n);
    }
    destroyBuffer(dev, staging.value());
    return s;
}

Status downloadFromBuffer(Device& dev, Buffer& src, VkDeviceSize offset, void* data, VkDeviceSize size) {
    if (size == 0) return Status::ok();
    BLUE_TRY(checkNotLost(dev));
    if (src.mapped) {
        std::memcpy(data, static_cast<const uint8_t*>(src.mapped) + offset, size);
        return Status::ok();
    }
    Result<Buffer> staging = createBuffer(dev, size, 0, MemKind::STAGING, "download staging");
    if (!staging) return staging.status();
    Status s = runTransfer(dev, src.buffer, offset, staging->buffer, 0, size);
    if (s) std::memcpy(data, staging->mapped, size);
    destroyBuffer(dev, staging.value());
    return s;
}

}  // namespace blue
