// Device ceilings (see peak.h): each shape is one compute pipeline (shaders/peak/*.comp with its
// workgroup size as specialisation constant 0) dispatched alone, timed on the host from submit to
// fence, best of the repetitions after a warm-up.
#include "host/peak.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include "host/buffer.h"
#include "host/vk_check.h"
#include "shaders/embedded.h"
#include "vm/status.h"

namespace blue {

namespace {

constexpr uint32_t kInvocations = 65536;  // per dispatch: enough to fill any GPU's lanes

const EmbeddedShader* embedded(const char* name) {
    for (size_t i = 0; i < kEmbeddedShaderCount; ++i) {
        if (std::strcmp(kEmbeddedShaders[i].name, name) == 0) return &kEmbeddedShaders[i];
    }
    return nullptr;
}

// The Vulkan objects of one measurement, destroyed with it.
class Bench {
public:
    explicit Bench(Device& dev) : dev_(dev) {}
    ~Bench() {
        VkDevice d = dev_.device();
        if (fence_) vkDestroyFence(d, fence_, nullptr);
        if (pool_) vkDestroyCommandPool(d, pool_, nullptr);
        if (dpool_) vkDestroyDescriptorPool(d, dpool_, nullptr);
        for (VkPipeline p : pipelines_) vkDestroyPipeline(d, p, nullptr);
        for (VkPipelineLayout l : layouts_) vkDestroyPipelineLayout(d, l, nullptr);
        for (VkDescriptorSetLayout l : set_layouts_) vkDestroyDescriptorSetLayout(d, l, nullptr);
        for (VkBufferView v : views_) vkDestroyBufferView(d, v, nullptr);
        destroyBuffer(dev_, src_);
        destroyBuffer(dev_, out_);
    }

    // `texel_bytes` and `storage_bytes`: the parts of the source the texel-buffer and the
    // storage-buffer shapes bind.
    Status init(uint64_t src_bytes, uint64_t texel_bytes, uint64_t storage_bytes) {
        VkDevice d = dev_.device();
        const VkBufferUsageFlags src_usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                             VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT |
                                             VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT;
        BLUE_TRY_ASSIGN(src_, createBuffer(dev_, src_bytes, src_usage, MemKind::DEVICE, "the bandwidth source"));
        BLUE_TRY_ASSIGN(out_, createBuffer(dev_, kInvocations * 4ull,
                                           VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                           MemKind::SHARED, "the ceiling results"));
        VkBufferViewCreateInfo vi{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
        vi.buffer = src_.buffer;
        vi.format = VK_FORMAT_R32G32B32A32_UINT;  // both texel kinds read it
        vi.range = texel_bytes;
        VkBufferView v;
        BLUE_VK_TRY_ON(dev_, vkCreateBufferView(d, &vi, nullptr, &v));
        views_.push_back(v);
        // One set layout per source kind: binding 0 the source, binding 1 the results.
        for (VkDescriptorType t : {VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER, VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER,
                                   VK_DESCRIPTOR_TYPE_STORAGE_BUFFER}) {
            VkDescriptorSetLayoutBinding b[2] = {};
            b[0] = {0, t, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
            b[1] = {1, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
            VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
            li.bindingCount = 2;
            li.pBindings = b;
            VkDescriptorSetLayout l;
            BLUE_VK_TRY_ON(dev_, vkCreateDescriptorSetLayout(d, &li, nullptr, &l));
            set_layouts_.push_back(l);
        }
        VkPushConstantRange pc{VK_SHADER_STAGE_COMPUTE_BIT, 0, 8};
        VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
        pli.setLayoutCount = 1;
        pli.pushConstantRangeCount = 1;
        pli.pPushConstantRanges = &pc;
        for (VkDescriptorSetLayout l : set_layouts_) {  // one pipeline layout per source kind
            pli.pSetLayouts = &l;
            VkPipelineLayout pl;
            BLUE_VK_TRY_ON(dev_, vkCreatePipelineLayout(d, &pli, nullptr, &pl));
            layouts_.push_back(pl);
        }
        VkDescriptorPoolSize sizes[] = {{VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER, 1},
                                        {VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER, 1},
                                        {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 4}};
        VkDescriptorPoolCreateInfo dpi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
        dpi.maxSets = 3;
        dpi.poolSizeCount = 3;
        dpi.pPoolSizes = sizes;
        BLUE_VK_TRY_ON(dev_, vkCreateDescriptorPool(d, &dpi, nullptr, &dpool_));
        for (size_t k = 0; k < 3; ++k) {
            VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
            ai.descriptorPool = dpool_;
            ai.descriptorSetCount = 1;
            ai.pSetLayouts = &set_layouts_[k];
            VkDescriptorSet s;
            BLUE_VK_TRY_ON(dev_, vkAllocateDescriptorSets(d, &ai, &s));
            VkDescriptorBufferInfo src_info{src_.buffer, 0, storage_bytes}, out_info{out_.buffer, 0, VK_WHOLE_SIZE};
            VkWriteDescriptorSet w[2] = {{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET}, {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET}};
            w[0].dstSet = w[1].dstSet = s;
            w[0].dstBinding = 0;
            w[0].descriptorCount = 1;
            w[0].descriptorType = k == 0 ? VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER
                                 : k == 1 ? VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER
                                          : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            if (k < 2) w[0].pTexelBufferView = &views_[0];
            else w[0].pBufferInfo = &src_info;
            w[1].dstBinding = 1;
            w[1].descriptorCount = 1;
            w[1].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            w[1].pBufferInfo = &out_info;
            vkUpdateDescriptorSets(d, 2, w, 0, nullptr);
            sets_.push_back(s);
        }
        VkCommandPoolCreateInfo cpi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
        cpi.queueFamilyIndex = dev_.queueFamily();
        cpi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
        BLUE_VK_TRY_ON(dev_, vkCreateCommandPool(d, &cpi, nullptr, &pool_));
        VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
        cai.commandPool = pool_;
        cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        cai.commandBufferCount = 1;
        BLUE_VK_TRY_ON(dev_, vkAllocateCommandBuffers(d, &cai, &cb_));
        VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        BLUE_VK_TRY_ON(dev_, vkCreateFence(d, &fi, nullptr, &fence_));
        return Status::ok();
    }

    Buffer& src() { return src_; }

    // A pipeline of embedded kernel `name` with workgroup size `wg`, for source kind `kind`
    // (0 image, 1 sampler, 2 storage buffer).
    Result<VkPipeline> pipeline(const char* name, uint32_t wg, size_t kind) {
        const EmbeddedShader* s = embedded(name);
        if (!s) return BLUE_ERROR("no embedded kernel %s", name);
        VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
        mi.codeSize = s->words * 4;
        mi.pCode = s->code;
        VkShaderModule module;
        BLUE_VK_TRY_ON(dev_, vkCreateShaderModule(dev_.device(), &mi, nullptr, &module));
        VkSpecializationMapEntry entry{0, 0, 4};
        VkSpecializationInfo spec{1, &entry, 4, &wg};
        VkComputePipelineCreateInfo pi{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
        pi.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
        pi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
        pi.stage.module = module;
        pi.stage.pName = "main";
        pi.stage.pSpecializationInfo = &spec;
        pi.layout = layouts_[kind];
        VkPipeline p = VK_NULL_HANDLE;
        Status made = [&]() -> Status {
            BLUE_VK_TRY_ON(dev_, vkCreateComputePipelines(dev_.device(), VK_NULL_HANDLE, 1, &pi, nullptr, &p));
            return Status::ok();
        }();
        vkDestroyShaderModule(dev_.device(), module, nullptr);
        if (!made) return made;
        pipelines_.push_back(p);
        return p;
    }

    // Runs one dispatch of `groups` workgroups and returns its wall time in seconds.
    Result<double> run(VkPipeline p, size_t kind, uint32_t groups, const uint32_t push[2]) {
        VkDevice d = dev_.device();
        BLUE_VK_TRY_ON(dev_, vkResetCommandBuffer(cb_, 0));
        VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        BLUE_VK_TRY_ON(dev_, vkBeginCommandBuffer(cb_, &bi));
        // The previous run's result writes (and the host's reads) come before this run's writes.
        VkMemoryBarrier before{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
        before.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        before.dstAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                             &before, 0, nullptr, 0, nullptr);
        vkCmdBindPipeline(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, p);
        vkCmdBindDescriptorSets(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, layouts_[kind], 0, 1, &sets_[kind], 0, nullptr);
        vkCmdPushConstants(cb_, layouts_[kind], VK_SHADER_STAGE_COMPUTE_BIT, 0, 8, push);
        vkCmdDispatch(cb_, groups, 1, 1);
        VkMemoryBarrier after{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
        after.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        after.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
        vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &after, 0,
                             nullptr, 0, nullptr);
        BLUE_VK_TRY_ON(dev_, vkEndCommandBuffer(cb_));
        VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
        si.commandBufferCount = 1;
        si.pCommandBuffers = &cb_;
        auto t0 = std::chrono::steady_clock::now();
        BLUE_VK_TRY_ON(dev_, vkQueueSubmit(dev_.queue(), 1, &si, fence_));
        BLUE_VK_TRY_ON(dev_, vkWaitForFences(d, 1, &fence_, VK_TRUE, UINT64_MAX));
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        BLUE_VK_TRY_ON(dev_, vkResetFences(d, 1, &fence_));
        return s;
    }

    // XOR of the result words the last run's `invocations` wrote.
    uint32_t resultXor(uint32_t invocations) const {
        const uint32_t* w = static_cast<const uint32_t*>(out_.mapped);
        uint32_t x = 0;
        for (uint32_t i = 0; i < invocations; ++i) x ^= w[i];
        return x;
    }

private:
    Device& dev_;
    Buffer src_, out_;
    std::vector<VkBufferView> views_;
    std::vector<VkDescriptorSetLayout> set_layouts_;
    std::vector<VkPipelineLayout> layouts_;
    std::vector<VkPipeline> pipelines_;
    VkDescriptorPool dpool_ = VK_NULL_HANDLE;
    std::vector<VkDescriptorSet> sets_;
    VkCommandPool pool_ = VK_NULL_HANDLE;
    VkCommandBuffer cb_ = VK_NULL_HANDLE;
    VkFence fence_ = VK_NULL_HANDLE;
};

// Best of `reps` runs after one warm-up (which also compiles the pipeline on lavapipe).
Result<double> bestTime(const std::function<Result<double>()>& once, int reps) {
    BLUE_TRY(once().status());
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        BLUE_TRY_ASSIGN(double t, once());
        best = std::min(best, t);
    }
    return best;
}

}  // namespace

Result<DevicePeak> measureDevicePeak(Device& dev, const PeakOptions& options) {
    const DeviceInfo& info = dev.info();
    DevicePeak peak;
    // The source: within one allocation and a quarter of the device memory. The texel shapes
    // read the part one texel buffer reaches, the storage shapes the part one storage binding
    // reaches (lavapipe: 2 GiB and 128 MiB; the Vulkan minimum: 1 MiB and 128 MiB). Each part is
    // a multiple of (invocations x 4 texels), so every walk divides it evenly; devices with small
    // limits get fewer invocations (at least 4 texels each).
    const uint32_t wg = std::min<uint32_t>(64, info.max_workgroup_invocations);
    const uint32_t subgroup = std::max<uint32_t>(1, info.subgroup_size);
    const uint32_t step = std::max(wg, subgroup);
    struct Part {
        uint64_t bytes = 0;
        uint32_t invocations = 0;
    };
    auto part = [&](uint64_t limit) {
        Part p;
        uint64_t b = std::min<uint64_t>({options.read_bytes, limit, dev.maxAllocationBytes(), info.device_local_bytes / 4});
        p.invocations = uint32_t(std::min<uint64_t>(kInvocations, b / 64) / step * step);
        if (p.invocations) p.bytes = b / (uint64_t(p.invocations) * 64) * (uint64_t(p.invocations) * 64);
        return p;
    };
    const Part texel = part(info.max_texel_buffer_elements * 16), storage = part(info.max_storage_buffer_range);
    if (texel.bytes == 0 || storage.bytes == 0) {
        return BLUE_ERROR("the device's bindings are too small for the bandwidth test (%llu texels, %llu bytes)",
                          (unsigned long long)info.max_texel_buffer_elements, (unsigned long long)info.max_storage_buffer_range);
    }
    const uint64_t bytes = std::max(texel.bytes, storage.bytes);
    peak.read_bytes = texel.bytes;
    Bench b(dev);
    BLUE_TRY(b.init(bytes, texel.bytes, storage.bytes));
    // A pattern with a known XOR: word i holds i * 2654435761.
    std::vector<uint32_t> words(bytes / 4);
    uint32_t x = 0, want_texel = 0, want_storage = 0;
    for (size_t i = 0; i < words.size(); ++i) {
        words[i] = uint32_t(i) * 2654435761u;
        x ^= words[i];
        if (i + 1 == texel.bytes / 4) want_texel = x;
        if (i + 1 == storage.bytes / 4) want_storage = x;
    }
    BLUE_TRY(uploadToBuffer(dev, b.src(), 0, words.data(), bytes));
    words = {};

    struct Source {
        const char* kernel;
        const char* what;
    };
    const Source sources[] = {{"peak_read_image", "uimageBuffer imageLoad"},
                              {"peak_read_sampler", "usamplerBuffer texelFetch"},
                              {"peak_read_storage", "storage buffer uvec4 loads"}};
    struct Walk {
        uint32_t lanes;
        std::string what;
    };
    std::vector<Walk> walks = {{1, "1 lane per walk (each invocation its own chunk)"}};
    if (subgroup > 1) walks.push_back({subgroup, strFormat("%u lanes per walk (a subgroup walks its chunk)", subgroup)});
    if (wg != subgroup) walks.push_back({wg, strFormat("%u lanes per walk (a workgroup walks its chunk)", wg)});
    walks.push_back({0, "all lanes walk together (lane i reads base + i, GPU style)"});  // 0: every invocation
    for (size_t k = 0; k < 3; ++k) {
        BLUE_TRY_ASSIGN(VkPipeline p, b.pipeline(sources[k].kernel, wg, k));
        const Part& at = k == 2 ? storage : texel;
        for (const Walk& w : walks) {
            PeakShape shape;
            shape.what = strFormat("%s, %s, workgroup %u", sources[k].what, w.what.c_str(), wg);
            if (at.bytes != peak.read_bytes) shape.what += strFormat(" (%.0f MiB: one storage binding)", double(at.bytes) / (1 << 20));
            const uint32_t push[2] = {uint32_t(at.bytes / 16), w.lanes ? w.lanes : at.invocations};
            auto t = bestTime([&] { return b.run(p, k, at.invocations / wg, push); }, options.reps);
            if (!t) return Status(t.status()).prefix(shape.what);
            const uint32_t expected = k == 2 ? want_storage : want_texel;
            if (b.resultXor(at.invocations) != expected) {
                return BLUE_ERROR("%s: the kernel did not read every word of the buffer (XOR %08x, expected %08x)",
                                  shape.what.c_str(), b.resultXor(at.invocations), expected);
            }
            shape.value = double(at.bytes) / t.value() / 1e9;
            peak.read.push_back(shape);
        }
    }

    // FMA: 1, 2 and 4 independent chains, workgroups of 64 and 256 where the device has them.
    for (uint32_t chains : {1u, 2u, 4u}) {
        for (uint32_t size : {64u, 256u}) {
            PeakShape shape;
            shape.what = strFormat("%u independent vec4 chain%s unrolled x8, workgroup %u", chains, chains > 1 ? "s" : "", size);
            if (size > info.max_workgroup_invocations || size > info.max_workgroup_size[0]) {
                shape.skipped = strFormat("workgroups of %u exceed the device's %u", size, info.max_workgroup_invocations);
                peak.fma.push_back(shape);
                continue;
            }
            std::string kernel = strFormat("peak_fma_%u", chains);
            BLUE_TRY_ASSIGN(VkPipeline p, b.pipeline(kernel.c_str(), size, 2));
            // Calibrate the iterations so one run takes about options.fma_ms.
            uint32_t iterations = 16;
            double t = 0;
            for (;;) {
                float m = 0.999f;
                uint32_t push[2] = {iterations, 0};
                std::memcpy(&push[1], &m, 4);
                BLUE_TRY_ASSIGN(t, bestTime([&] { return b.run(p, 2, kInvocations / size, push); }, options.reps));
                if (t * 1e3 >= options.fma_ms * 0.5 || iterations >= (1u << 20)) break;
                iterations *= std::max<uint32_t>(2, uint32_t(std::min(64.0, options.fma_ms * 1e-3 / std::max(t, 1e-6))));
            }
            const double flops = double(kInvocations) * iterations * 8.0 * chains * 8.0;
            shape.value = flops / t / 1e9;
            peak.fma.push_back(shape);
        }
    }
    return peak;
}

namespace {

const PeakShape* best(const std::vector<PeakShape>& shapes) {
    const PeakShape* b = nullptr;
    for (const PeakShape& s : shapes) {
        if (s.skipped.empty() && (!b || s.value > b->value)) b = &s;
    }
    return b;
}

}  // namespace

const PeakShape* DevicePeak::bestRead() const { return best(read); }
const PeakShape* DevicePeak::bestFma() const { return best(fma); }
double DevicePeak::readGBs() const { return bestRead() ? bestRead()->value : 0; }
double DevicePeak::fmaGFlops() const { return bestFma() ? bestFma()->value : 0; }

}  // namespace blue
