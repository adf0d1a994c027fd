// Vulkan teardown leaks without BlueVM: the evidence behind tests/sanitizers/lsan.supp.
//
// Plain Vulkan (no BlueVM code) does the work one BlueVM machine does -- a storage buffer, a
// descriptor set, a compute pipeline, one dispatch submitted and waited for -- then destroys every
// object in order and the device and instance too. Built with AddressSanitizer, LeakSanitizer
// still reports memory allocated inside lavapipe (Mesa 22.3.6) and, with the layer on, inside the
// Khronos validation layer (1.3.239): their leaks, which the suppressions cover.
// With --keep-buffer the buffer is not destroyed: the validation layer then names it at
// vkDestroyDevice (VUID-vkDestroyDevice-device-...), the check tools/test_sanitize.sh uses for the
// Vulkan objects BlueVM could leave behind.
//
// Build and run (from the repository root):
//   c++ -std=c++17 -g -fsanitize=address tools/repro/vk_teardown_leaks.cpp -lvulkan -o /tmp/leaks
//   cc -shared -fPIC -o /tmp/keep_loaded.so tests/sanitizers/keep_loaded.c
//   LD_PRELOAD=$(ldd /tmp/leaks | awk '/libasan/ {print $3}'):/tmp/keep_loaded.so \
//     VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation /tmp/leaks [rounds] [--keep-buffer]
// Leave out VK_INSTANCE_LAYERS for lavapipe alone; add
// LSAN_OPTIONS=suppressions=tests/sanitizers/lsan.supp to see every report suppressed.
// (The shader: `layout(local_size_x = 1) in; layout(binding = 0) buffer B { uint d[]; };
// void main() { d[0] = 1u; }`, compiled by glslangValidator -V, optimised and stripped.)
#include <vulkan/vulkan.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

const uint32_t kShader[] = {
    0x07230203, 0x00010000, 0x0008000b, 0x00000012, 0x00000000, 0x00020011,
    0x00000001, 0x0006000b, 0x00000001, 0x4c534c47, 0x6474732e, 0x3035342e,
    0x00000000, 0x0003000e, 0x00000000, 0x00000001, 0x0005000f, 0x00000005,
    0x00000004, 0x6e69616d, 0x00000000, 0x00060010, 0x00000004, 0x00000011,
    0x00000001, 0x00000001, 0x00000001, 0x00040047, 0x00000007, 0x00000006,
    0x00000004, 0x00050048, 0x00000008, 0x00000000, 0x00000023, 0x00000000,
    0x00030047, 0x00000008, 0x00000003, 0x00040047, 0x0000000a, 0x00000022,
    0x00000000, 0x00040047, 0x0000000a, 0x00000021, 0x00000000, 0x00040047,
    0x00000011, 0x0000000b, 0x00000019, 0x00020013, 0x00000002, 0x00030021,
    0x00000003, 0x00000002, 0x00040015, 0x00000006, 0x00000020, 0x00000000,
    0x0003001d, 0x00000007, 0x00000006, 0x0003001e, 0x00000008, 0x00000007,
    0x00040020, 0x00000009, 0x00000002, 0x00000008, 0x0004003b, 0x00000009,
    0x0000000a, 0x00000002, 0x00040015, 0x0000000b, 0x00000020, 0x00000001,
    0x0004002b, 0x0000000b, 0x0000000c, 0x00000000, 0x0004002b, 0x00000006,
    0x0000000d, 0x00000001, 0x00040020, 0x0000000e, 0x00000002, 0x00000006,
    0x00040017, 0x00000010, 0x00000006, 0x00000003, 0x0006002c, 0x00000010,
    0x00000011, 0x0000000d, 0x0000000d, 0x0000000d, 0x00050036, 0x00000002,
    0x00000004, 0x00000000, 0x00000003, 0x000200f8, 0x00000005, 0x00060041,
    0x0000000e, 0x0000000f, 0x0000000a, 0x0000000c, 0x0000000c, 0x0003003e,
    0x0000000f, 0x0000000d, 0x000100fd, 0x00010038
};

void check(VkResult r, const char* what) {
    if (r != VK_SUCCESS) {
        std::fprintf(stderr, "%s failed: %d\n", what, int(r));
        std::exit(1);
    }
}

VKAPI_ATTR VkBool32 VKAPI_CALL onMessage(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                         VkDebugUtilsMessageTypeFlagsEXT,
                                         const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
    if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        std::fprintf(stderr, "validation: %s\n", data->pMessage);
    }
    return VK_FALSE;
}

// One round: device, the objects of one dispatch, everything destroyed again.
void round(VkInstance instance, VkPhysicalDevice gpu, bool keep_buffer) {
    float priority = 1;
    VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qi.queueCount = 1;
    qi.pQueuePriorities = &priority;
    VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    VkDevice dev;
    check(vkCreateDevice(gpu, &di, nullptr, &dev), "vkCreateDevice");
    VkQueue queue;
    vkGetDeviceQueue(dev, 0, 0, &queue);

    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = 256;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    VkBuffer buffer;
    check(vkCreateBuffer(dev, &bi, nullptr, &buffer), "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, buffer, &req);
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = uint32_t(__builtin_ctz(req.memoryTypeBits));
    VkDeviceMemory memory;
    check(vkAllocateMemory(dev, &ai, nullptr, &memory), "vkAllocateMemory");
    check(vkBindBufferMemory(dev, buffer, memory, 0), "vkBindBufferMemory");

    VkDescriptorSetLayoutBinding binding{0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                         VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    li.bindingCount = 1;
    li.pBindings = &binding;
    VkDescriptorSetLayout set_layout;
    check(vkCreateDescriptorSetLayout(dev, &li, nullptr, &set_layout), "vkCreateDescriptorSetLayout");
    VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &set_layout;
    VkPipelineLayout layout;
    check(vkCreatePipelineLayout(dev, &pli, nullptr, &layout), "vkCreatePipelineLayout");
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1};
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = 1;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &size;
    VkDescriptorPool pool;
    check(vkCreateDescriptorPool(dev, &pi, nullptr, &pool), "vkCreateDescriptorPool");
    VkDescriptorSetAllocateInfo si{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    si.descriptorPool = pool;
    si.descriptorSetCount = 1;
    si.pSetLayouts = &set_layout;
    VkDescriptorSet set;
    check(vkAllocateDescriptorSets(dev, &si, &set), "vkAllocateDescriptorSets");
    VkDescriptorBufferInfo info{buffer, 0, VK_WHOLE_SIZE};
    VkWriteDescriptorSet w{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    w.dstSet = set;
    w.descriptorCount = 1;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &info;
    vkUpdateDescriptorSets(dev, 1, &w, 0, nullptr);

    VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    mi.codeSize = sizeof kShader;
    mi.pCode = kShader;
    VkShaderModule module;
    check(vkCreateShaderModule(dev, &mi, nullptr, &module), "vkCreateShaderModule");
    VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = module;
    ci.stage.pName = "main";
    ci.layout = layout;
    VkPipeline pipeline;
    check(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &ci, nullptr, &pipeline),
          "vkCreateComputePipelines");
    vkDestroyShaderModule(dev, module, nullptr);

    VkCommandPoolCreateInfo cpi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    VkCommandPool cmd_pool;
    check(vkCreateCommandPool(dev, &cpi, nullptr, &cmd_pool), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = cmd_pool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    VkCommandBuffer cb;
    check(vkAllocateCommandBuffers(dev, &cai, &cb), "vkAllocateCommandBuffers");
    VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    check(vkBeginCommandBuffer(cb, &begin), "vkBeginCommandBuffer");
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, &set, 0, nullptr);
    vkCmdDispatch(cb, 1, 1, 1);
    check(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence;
    check(vkCreateFence(dev, &fi, nullptr, &fence), "vkCreateFence");
    VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &cb;
    check(vkQueueSubmit(queue, 1, &submit, fence), "vkQueueSubmit");
    check(vkWaitForFences(dev, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");

    vkDestroyFence(dev, fence, nullptr);
    vkDestroyCommandPool(dev, cmd_pool, nullptr);
    vkDestroyPipeline(dev, pipeline, nullptr);
    vkDestroyDescriptorPool(dev, pool, nullptr);
    vkDestroyPipelineLayout(dev, layout, nullptr);
    vkDestroyDescriptorSetLayout(dev, set_layout, nullptr);
    if (!keep_buffer) vkDestroyBuffer(dev, buffer, nullptr);
    vkFreeMemory(dev, memory, nullptr);
    vkDestroyDevice(dev, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 1;
    bool keep_buffer = argc > 2 && std::strcmp(argv[2], "--keep-buffer") == 0;
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.apiVersion = VK_API_VERSION_1_2;
    const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkInstanceCreateInfo ii{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ii.pApplicationInfo = &app;
    ii.enabledExtensionCount = 1;
    ii.ppEnabledExtensionNames = &ext;
    VkInstance instance;
    check(vkCreateInstance(&ii, nullptr, &instance), "vkCreateInstance");
    auto create_messenger = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
    auto destroy_messenger = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
    VkDebugUtilsMessengerCreateInfoEXT mci{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    mci.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                          VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT;
    mci.pfnUserCallback = onMessage;
    VkDebugUtilsMessengerEXT messenger;
    check(create_messenger(instance, &mci, nullptr, &messenger), "vkCreateDebugUtilsMessengerEXT");
    uint32_t n = 1;
    VkPhysicalDevice gpu;
    VkResult r = vkEnumeratePhysicalDevices(instance, &n, &gpu);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) check(r, "vkEnumeratePhysicalDevices");
    for (int i = 0; i < rounds; ++i) round(instance, gpu, keep_buffer);
    destroy_messenger(instance, messenger, nullptr);
    vkDestroyInstance(instance, nullptr);
    std::printf("%d round(s) done\n", rounds);
    return 0;
}
