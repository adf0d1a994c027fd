// Buffer creation and transfers (see buffer.h).
#include "host/buffer.h"

#include <cstring>

#include "host/vk_check.h"

namespace blue {

namespace {

int findMemoryType(const Device& dev, uint32_t type_bits, VkMemoryPropertyFlags want) {
    const VkPhysicalDeviceMemoryProperties& mem = dev.memory();
    for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
        if ((type_bits & (1u << i)) && (mem.memoryTypes[i].propertyFlags & want) == want) return int(i);
    }
    return -1;
}

// Memory property preferences per kind, best first.
std::vector<VkMemoryPropertyFlags> preferences(MemKind kind) {
    const VkMemoryPropertyFlags local = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    switch (kind) {
        case MemKind::DEVICE: return {local | host, local};
        case MemKind::SHARED: return {host | VK_MEMORY_PROPERTY_HOST_CACHED_BIT, host};
        case MemKind::STAGING: return {host};
    }
    return {};
}

// Runs one transfer command buffer to completion.
Status runTransfer(Device& dev, VkBuffer src, VkDeviceSize src_off, VkBuffer dst, VkDeviceSize dst_off,
                   VkDeviceSize size) {
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = dev.queueFamily();
    pi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    VkCommandPool pool;
    BLUE_VK_TRY(vkCreateCommandPool(dev.device(), &pi, nullptr, &pool));
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cb;
    VkResult r = vkAllocateCommandBuffers(dev.device(), &ai, &cb);
    if (r == VK_SUCCESS) {
        VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        vkBeginCommandBuffer(cb, &bi);
        VkBufferCopy region{src_off, dst_off, size};
        vkCmdCopyBuffer(cb, src, dst, 1, &region);
        VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
        mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
        mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT | VK_ACCESS_SHADER_READ_BIT;
        vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT,
                             VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                             &mb, 0, nullptr, 0, nullptr);
        vkEndCommandBuffer(cb);
        VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
        si.commandBufferCount = 1;
        si.pCommandBuffers = &cb;
        r = vkQueueSubmit(dev.queue(), 1, &si, VK_NULL_HANDLE);
        if (r == VK_SUCCESS) r = vkQueueWaitIdle(dev.queue());
    }
    vkDestroyCommandPool(dev.device(), pool, nullptr);
    BLUE_VK_TRY(r);
    return Status::ok();
}

}  // namespace

Result<Buffer> createBuffer(Device& dev, VkDeviceSize size, VkBufferUsageFlags usage, MemKind kind,
                            const char* purpose) {
    Buffer b;
    b.size = (size + 15) & ~VkDeviceSize(15);
    if (b.size == 0) b.size = 16;
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = b.size;
    bi.usage = usage | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    BLUE_VK_TRY(vkCreateBuffer(dev.device(), &bi, nullptr, &b.buffer));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev.device(), b.buffer, &req);
    VkResult r = VK_ERROR_OUT_OF_DEVICE_MEMORY;
    VkMemoryPropertyFlags got = 0;
    for (VkMemoryPropertyFlags want : preferences(kind)) {
        int type = findMemoryType(dev, req.memoryTypeBits, want);
        if (type < 0) continue;
        VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
        ai.allocationSize = req.size;
        ai.memoryTypeIndex = uint32_t(type);
        r = vkAllocateMemory(dev.device(), &ai, nullptr, &b.memory);
        if (r == VK_SUCCESS) {
            got = dev.memory().memoryTypes[type].propertyFlags;
            break;
        }
    }
    if (r != VK_SUCCESS) {
        vkDestroyBuffer(dev.device(), b.buffer, nullptr);
        return BLUE_ERROR("cannot allocate %.1f MiB of GPU memory for %s (%s)",
                          double(b.size) / (1 << 20), purpose, vkResultName(r));
    }
    BLUE_VK_TRY(vkBindBufferMemory(dev.device(), b.buffer, b.memory, 0));
    if (got & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
        BLUE_VK_TRY(vkMapMemory(dev.device(), b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped));
        if (!(got & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
            vkUnmapMemory(dev.device(), b.memory);  // keep to coherent mappings only
            b.mapped = nullptr;
        }
    }
    return b;
}

void destroyBuffer(Device& dev, Buffer& b) {
    if (b.buffer) vkDestroyBuffer(dev.device(), b.buffer, nullptr);
    if (b.memory) vkFreeMemory(dev.device(), b.memory, nullptr);
    b = Buffer{};
}

Status uploadToBuffer(Device& dev, Buffer& dst, VkDeviceSize offset, const void* data, VkDeviceSize size) {
    if (size == 0) return Status::ok();
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
