// Custom kernels on the GPU: the module's SPIR-V (section KERNELS) is checked again here, right
// before a pipeline is made from it (the module is untrusted: a caller may hand the machine a
// module that never went through the loader), and each KERNEL dispatch gets a descriptor set
// holding only what the contract of vm/kernel_abi.h gives a kernel: the block's item list and
// the instances' slots (read-only) and results. Descriptor offsets must be multiples of
// minStorageBufferOffsetAlignment: each binding starts at the aligned offset below its data, its
// range is extended by the difference, and the data's first word reaches the kernel as a push
// constant (items_base, in_base, out_base).
#include "host/machine_impl.h"
#include "host/vk_check.h"
#include "shaders/blue_config.h"
#include "vm/isa.h"
#include "vm/kernel.h"
#include "vm/kernel_abi.h"
#include "vm/verify.h"

namespace blue {

namespace {

struct Range {
    VkDeviceSize offset = 0, size = 0;
    uint32_t base_word = 0;  // the data's first word from the bound offset
};

Range alignedRange(VkDeviceSize offset, VkDeviceSize size, VkDeviceSize align) {
    if (align == 0) align = 1;
    Range r;
    r.offset = offset / align * align;
    r.size = size + (offset - r.offset);
    r.base_word = uint32_t((offset - r.offset) / 4);
    return r;
}

}  // namespace

void GpuMachine::Impl::destroyCustomKernels() {
    VkDevice d = dev.device();
    for (VkPipeline p : custom_pipelines) {
        if (p) vkDestroyPipeline(d, p, nullptr);
    }
    custom_pipelines.clear();
    if (custom_pool) vkDestroyDescriptorPool(d, custom_pool, nullptr);
    if (custom_layout) vkDestroyPipelineLayout(d, custom_layout, nullptr);
    if (custom_set_layout) vkDestroyDescriptorSetLayout(d, custom_set_layout, nullptr);
    custom_pool = VK_NULL_HANDLE;
    custom_layout = VK_NULL_HANDLE;
    custom_set_layout = VK_NULL_HANDLE;
}

Status GpuMachine::Impl::createCustomKernels() {
    uint32_t used = 0;
    for (const DispatchDesc& d : dispatches) used += d.custom >= 0;
    custom_sets.assign(dispatches.size(), VK_NULL_HANDLE);
    custom_push.assign(dispatches.size(), {});
    if (used == 0) return Status::ok();
    VkDevice d = dev.device();
    const DeviceInfo& info = dev.info();

    VkDescriptorSetLayoutBinding b[BLUE_KERNEL_BINDINGS] = {};
    for (uint32_t i = 0; i < BLUE_KERNEL_BINDINGS; ++i) {
        b[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    }
    VkDescriptorSetLayoutCreateInfo si{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    si.bindingCount = BLUE_KERNEL_BINDINGS;
    si.pBindings = b;
    BLUE_VK_TRY_ON(dev, vkCreateDescriptorSetLayout(d, &si, nullptr, &custom_set_layout));
    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, BLUE_KERNEL_PUSH_WORDS * 4};
    VkPipelineLayoutCreateInfo li{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    li.setLayoutCount = 1;
    li.pSetLayouts = &custom_set_layout;
    li.pushConstantRangeCount = 1;
    li.pPushConstantRanges = &range;
    BLUE_VK_TRY_ON(dev, vkCreatePipelineLayout(d, &li, nullptr, &custom_layout));

    custom_pipelines.assign(m.kernels.size(), VK_NULL_HANDLE);
    for (const DispatchDesc& desc : dispatches) {
        if (desc.custom < 0 || custom_pipelines[size_t(desc.custom)]) continue;
        const KernelDecl& k = m.kernels[size_t(desc.custom)];
        std::string what = "kernel '" + k.name + "'";
        BLUE_TRY_ASSIGN(KernelShape shape, checkKernelSpirv(k.spirv, what));
        for (int axis = 0; axis < 3; ++axis) {
            if (shape.local[axis] > info.max_workgroup_size[axis]) {
                return BLUE_ERROR(
                    "%s: workgroup size %u along %c is more than this device allows (%u)",
                    what.c_str(), shape.local[axis], "xyz"[axis], info.max_workgroup_size[axis]);
            }
        }
        VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
        mi.codeSize = k.spirv.size() * 4;
        mi.pCode = k.spirv.data();
        VkShaderModule module;
        BLUE_VK_TRY_ON(dev, vkCreateShaderModule(d, &mi, nullptr, &module));
        VkComputePipelineCreateInfo pi{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
        pi.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
        pi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
        pi.stage.module = module;
        pi.stage.pName = "main";
        pi.layout = custom_layout;
        VkPipeline pipeline = VK_NULL_HANDLE;
        VkResult r = vkCreateComputePipelines(d, VK_NULL_HANDLE, 1, &pi, nullptr, &pipeline);
        vkDestroyShaderModule(d, module, nullptr);
        BLUE_VK_TRY(r);
        custom_pipelines[size_t(desc.custom)] = pipeline;
    }

    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, used * BLUE_KERNEL_BINDINGS};
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = used;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &size;
    BLUE_VK_TRY_ON(dev, vkCreateDescriptorPool(d, &pi, nullptr, &custom_pool));
    const VkDeviceSize align = info.min_storage_offset_alignment;
    const uint32_t ninst = opt.instances;
    for (size_t i = 0; i < dispatches.size(); ++i) {
        const DispatchDesc& desc = dispatches[i];
        if (desc.custom < 0) continue;
        VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
        ai.descriptorPool = custom_pool;
        ai.descriptorSetCount = 1;
        ai.pSetLayouts = &custom_set_layout;
        BLUE_VK_TRY_ON(dev, vkAllocateDescriptorSets(d, &ai, &custom_sets[i]));
        // The KERNEL instruction's operands: results (0), slot (1).
        std::vector<TensorInstr> instrs;
        BLUE_TRY(decodeBlock(m, m.blocks[desc.block], &instrs));
        const TensorInstr* ti = nullptr;
        for (const TensorInstr& t : instrs) {
            if (t.op == Op::KERNEL && int32_t(t.args[2]) == desc.custom) ti = &t;
        }
        if (!ti)
            return BLUE_ERROR("block '%s': no KERNEL instruction for its dispatch",
                              m.blocks[desc.block].name.c_str());
        const TensorPlace& out = pages.places[ti->args[0]];
        const TensorPlace& in = pages.places[ti->args[1]];
        // The written slot (`filter`); without one, binding 3 repeats the results (the verifier
        // made sure the kernel does not declare it).
        const bool writes = ti->args[4] != 0xFFFFFFFFu;
        const TensorPlace& slot_out = pages.places[writes ? ti->args[4] : ti->args[0]];
        Range items = alignedRange(
            VkDeviceSize(layout.at(BLUE_O_LISTS) + uint64_t(desc.block) * 3 * ninst) * 4,
            VkDeviceSize(ninst) * 4, align);
        Range slots = alignedRange(in.offset, in.slice * ninst, align);
        Range results = alignedRange(out.offset, out.slice * ninst, align);
        Range written = alignedRange(slot_out.offset, slot_out.slice * ninst, align);
        VkDescriptorBufferInfo bi[BLUE_KERNEL_BINDINGS] = {
            {control.buffer, items.offset, items.size},
            {page_buffers[in.page].buffer, slots.offset, slots.size},
            {page_buffers[out.page].buffer, results.offset, results.size},
            {page_buffers[slot_out.page].buffer, written.offset, written.size}};
        VkWriteDescriptorSet w[BLUE_KERNEL_BINDINGS] = {};
        for (uint32_t k = 0; k < BLUE_KERNEL_BINDINGS; ++k) {
            w[k] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
            w[k].dstSet = custom_sets[i];
            w[k].dstBinding = k;
            w[k].descriptorCount = 1;
            w[k].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            w[k].pBufferInfo = &bi[k];
        }
        vkUpdateDescriptorSets(d, BLUE_KERNEL_BINDINGS, w, 0, nullptr);
        auto& push = custom_push[i];
        push[BLUE_KERNEL_PC_ITEMS_BASE] = items.base_word;
        push[BLUE_KERNEL_PC_IN_BASE] = slots.base_word;
        push[BLUE_KERNEL_PC_IN_STRIDE] = uint32_t(in.slice / 4);
        push[BLUE_KERNEL_PC_OUT_BASE] = results.base_word;
        push[BLUE_KERNEL_PC_OUT_STRIDE] = uint32_t(out.slice / 4);
        push[BLUE_KERNEL_PC_PARAM] = ti->args[3];
        push[BLUE_KERNEL_PC_OUT_SLOT_BASE] = written.base_word;
        push[BLUE_KERNEL_PC_OUT_SLOT_STRIDE] = uint32_t(slot_out.slice / 4);
    }
    return Status::ok();
}

}  // namespace blue
