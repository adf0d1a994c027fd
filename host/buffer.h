// GPU buffers: one VkBuffer with its own memory allocation. Four kinds of memory:
//   DEVICE  device-local (mappable too on unified-memory devices such as lavapipe)
//   SHARED  host-visible and coherent, for rings and counters the host reads and writes
//   STAGING host-visible, for uploads to DEVICE memory that the host cannot map
//   HOST    host memory the kernels read directly (tier 1: weights beyond --vram-budget); not
//           device-local where the device has such a type, so it takes no VRAM
#pragma once

#include <volk.h>

#include "host/device.h"

namespace blue {

enum class MemKind { DEVICE, SHARED, STAGING, HOST };

struct Buffer {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkDeviceSize size = 0;
    void* mapped = nullptr;  // non-null when the host can write it directly
};

// Creates a buffer of `size` bytes (rounded up to 16). Fails with a message naming the purpose,
// the size and the failing call when the device has no memory for it ("... out of device memory
// (VK_ERROR_OUT_OF_DEVICE_MEMORY from vkAllocateMemory at host/buffer.cpp:LINE)"). These functions
// fail fast on a device that was lost (Device::lost), and mark it lost when one of their calls
// returns VK_ERROR_DEVICE_LOST; a failed call leaves nothing allocated.
Result<Buffer> createBuffer(Device& dev, VkDeviceSize size, VkBufferUsageFlags usage, MemKind kind,
                            const char* purpose);
void destroyBuffer(Device& dev, Buffer& b);

// Copies host bytes into a buffer: directly when mapped, else through a staging buffer and a
// one-off transfer (which waits for completion).
Status uploadToBuffer(Device& dev, Buffer& dst, VkDeviceSize offset, const void* data,
                      VkDeviceSize size);
// Copies bytes out of a buffer (directly when mapped, else through staging).
Status downloadFromBuffer(Device& dev, Buffer& src, VkDeviceSize offset, void* data,
                          VkDeviceSize size);

}  // namespace blue
