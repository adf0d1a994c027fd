// GpuMachine: loading and the leapfrogging run loop (see machine.h); chain recording is in
// machine_chain.cpp.
#include "host/machine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

#include "host/machine_impl.h"
#include "host/vk_check.h"
#include "host/weight_layout.h"
#include "vm/abi.h"

namespace blue {

GpuMachine::Impl::~Impl() {
    VkDevice d = dev.device();
    vkDeviceWaitIdle(d);
    destroyCustomKernels();
    for (VkFence f : fences) vkDestroyFence(d, f, nullptr);
    if (queries) vkDestroyQueryPool(d, queries, nullptr);
    if (timing) vkDestroyQueryPool(d, timing, nullptr);
    if (cmd_pool) vkDestroyCommandPool(d, cmd_pool, nullptr);
    if (pool) vkDestroyDescriptorPool(d, pool, nullptr);
    if (operand_pool) vkDestroyDescriptorPool(d, operand_pool, nullptr);
    for (VkBufferView v : page_views) vkDestroyBufferView(d, v, nullptr);
    for (Buffer& b : page_buffers) destroyBuffer(dev, b);
    for (Buffer& b : slot_buffers) destroyBuffer(dev, b);
    destroyBuffer(dev, control);
    destroyBuffer(dev, io);
}

Status GpuMachine::Impl::allocate() {
    Result<Buffer> c =
        createBuffer(dev, layout.control_words * 4,
                     VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT |
                         (dev.info().conditional_rendering ? VK_BUFFER_USAGE_CONDITIONAL_RENDERING_BIT_EXT : 0),
                     MemKind::DEVICE, "the control buffer");
    if (!c) return c.status();
    control = c.value();
    Result<Buffer> i = createBuffer(dev, layout.io_words * 4, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                    MemKind::SHARED, "the I/O rings");
    if (!i) return i.status();
    io = i.value();
    if (!io.mapped) return Status::error("the I/O buffer is not host-mappable");
    std::memset(io.mapped, 0, layout.io_words * 4);
    for (size_t p = 0; p < pages.page_bytes.size(); ++p) {
        std::string what = strFormat("tensor page %zu", p);
        const bool host = p < pages.page_tier.size() && pages.page_tier[p] == 1;
        if (host) what += " (host memory, beyond the VRAM budget)";
        Result<Buffer> b = createBuffer(
            dev, pages.page_bytes[p],
            VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT |
                VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
            host ? MemKind::HOST : MemKind::DEVICE, what.c_str());
        if (!b) return b.status();
        page_buffers.push_back(b.value());
        VkBufferViewCreateInfo vi{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
        vi.buffer = b->buffer;
        vi.format = VK_FORMAT_R32G32B32A32_UINT;
        vi.range = b->size / 16 * 16;
        VkBufferView view;
        BLUE_VK_TRY_ON(dev, vkCreateBufferView(dev.device(), &vi, nullptr, &view));
        page_views.push_back(view);
    }
    if (!streams.groups.empty()) {
        // The slots' views follow the pages' (planStreams points operand 1 at them).
        for (int s = 0; s < 2; ++s) {
            Result<Buffer> b = createBuffer(
                dev, pages.slot_bytes, VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                MemKind::DEVICE, s ? "weight slot B" : "weight slot A");
            if (!b) return b.status();
            slot_buffers[s] = b.value();
            VkBufferViewCreateInfo vi{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
            vi.buffer = b->buffer;
            vi.format = VK_FORMAT_R32G32B32A32_UINT;
            vi.range = b->size / 16 * 16;
            VkBufferView view;
            BLUE_VK_TRY_ON(dev, vkCreateBufferView(dev.device(), &vi, nullptr, &view));
            page_views.push_back(view);
        }
    }
    return Status::ok();
}

Status GpuMachine::Impl::initControl() {
    std::vector<uint32_t> w(layout.control_words, 0);
    std::copy(layout.header.begin(), layout.header.end(), w.begin());
    const uint32_t n = opt.instances;
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t s = layout.at(BLUE_O_STATE) + i * BLUE_STATE_WORDS;
        w[s + BLUE_S_PC] = m.layout.entry;
        w[s + BLUE_S_STATUS] = BLUE_ST_RUNNING;
    }
    std::copy(m.code.begin(), m.code.end(), w.begin() + layout.at(BLUE_O_CODE));
    std::copy(m.consts.begin(), m.consts.end(), w.begin() + layout.at(BLUE_O_CONST));
    for (uint32_t b = 0; b < m.blocks.size(); ++b) {
        w[layout.at(BLUE_O_BLOCKS) + b * BLUE_BLOCK_WORDS + BLUE_B_NARGS] = m.blocks[b].nargs;
    }
    for (size_t d = 0; d < dispatches.size(); ++d) {
        uint32_t at = layout.at(BLUE_O_DISPATCH) + uint32_t(d) * BLUE_DISPATCH_WORDS;
        w[at + BLUE_D_BLOCK] = dispatches[d].block;
        w[at + BLUE_D_MODE] = dispatches[d].mode;
        w[at + BLUE_D_FIXED] = dispatches[d].fixed;
        w[at + BLUE_D_TILE] = dispatches[d].tile;
        w[at + BLUE_D_AXIS] = dispatches[d].axis;
        w[at + BLUE_D_RANGE] = std::min(dispatches[d].min_items, 0xFFFFu) |
                               std::min(dispatches[d].max_items, 0xFFFFu) << 16;
    }
    uint32_t seq = layout.at(BLUE_O_INDIRECT) + uint32_t(dispatches.size()) * 3;
    // The first cycle's sequencer groups; later cycles' are written by the plan, which also stops
    // at max_cycles. With max_cycles 0 nothing runs, as on the reference machine.
    w[seq] = opt.max_cycles > 0 ? (n + BLUE_SEQ_WG - 1) / BLUE_SEQ_WG : 0;
    w[seq + 1] = 1;
    w[seq + 2] = 1;
    for (uint32_t t = 0; t < m.tensors.size(); ++t) {
        uint32_t at = layout.at(BLUE_O_TENSORS) + t * BLUE_TREF_WORDS;
        const TensorPlace& p = pages.places[t];
        w[at] = p.page | m.tensors[t].cls << 16;
        w[at + 1] = uint32_t(p.offset);
        w[at + 2] = uint32_t(p.slice);
        // TLD and TST fault on a matrix split over pages rather than read past its first piece,
        // and on one that streams (only copies reach its page).
        const bool streamed = !streams.groups.empty() && p.tier == 1 && p.repacked;
        w[at + 3] = p.pieces.empty() && !streamed ? uint32_t(m.tensors[t].elements()) : 0;
    }
    for (const ExpertCache& c : pages.expert_caches) {
        const uint32_t st = layout.at(BLUE_O_EXPERT_CACHE) + c.state;
        w[st + BLUE_XC_SLOTS] = c.slots;
        w[st + BLUE_XC_EXPERTS] = c.experts;
        uint64_t texels = 0;
        for (const TensorPlace& p : c.caches) texels += p.slice / 16;
        w[st + BLUE_XC_TEXELS] = uint32_t(texels);
    }
    w[BLUE_C_BUMP] = m.layout.heap_static;
    w[BLUE_C_LIVE] = n;
    return uploadToBuffer(dev, control, 0, w.data(), w.size() * 4);
}

Status GpuMachine::Impl::uploadWeights(const WeightSource& weights) {
    for (size_t p = 0; p < page_buffers.size(); ++p) {
        std::vector<uint8_t> zeros;
        if (page_buffers[p].mapped) {
            std::memset(page_buffers[p].mapped, 0, page_buffers[p].size);
        } else {
            zeros.assign(page_buffers[p].size, 0);
            BLUE_TRY(uploadToBuffer(dev, page_buffers[p], 0, zeros.data(), zeros.size()));
        }
    }
    uint64_t total = 0, done = 0;
    for (uint32_t t = 0; t < m.tensors.size(); ++t) total += weights.tensorBytes(t).size();
    for (uint32_t t = 0; t < m.tensors.size(); ++t) {
        std::span<const uint8_t> bytes = weights.tensorBytes(t);
        if (bytes.empty()) continue;
        if (opt.on_load) opt.on_load(done, total);
        done += bytes.size();
        const TensorPlace& p = pages.places[t];
        Buffer& page = page_buffers[p.page];
        if (!p.repacked) {
            BLUE_TRY(uploadToBuffer(dev, page, p.offset, bytes.data(), bytes.size()));
            continue;
        }
        const TensorDecl& d = m.tensors[t];
        WeightLayout wl;
        weightLayout(d.dtype, d.ne[0], d.ne[1], &wl);
        // A 3-D weight is one matrix per expert, each repacked into its own slice.
        const uint64_t matrices = d.ndim == 3 ? d.ne[2] : 1;
        const uint64_t row_bytes = *dtypeRowBytes(d.dtype, d.ne[0]), src_bytes = row_bytes * d.ne[1];
        // A matrix split by rows: each piece is a [K, rows] matrix of its own.
        for (const TensorPiece& piece : p.pieces) {
            WeightLayout pl;
            weightLayout(d.dtype, d.ne[0], piece.rows, &pl);
            std::vector<uint8_t> packed(pl.bytes, 0);
            repackMatrix(d.dtype, bytes.data() + piece.row_begin * row_bytes, d.ne[0], piece.rows,
                         pl, packed.data());
            BLUE_TRY(uploadToBuffer(dev, page_buffers[piece.page], piece.offset, packed.data(),
                                    packed.size()));
        }
        if (!p.pieces.empty()) continue;
        for (uint64_t e = 0; e < matrices; ++e) {
            const uint8_t* src = bytes.data() + e * src_bytes;
            if (page.mapped) {  // unified memory: repack straight into the page
                repackMatrix(d.dtype, src, d.ne[0], d.ne[1], wl,
                             static_cast<uint8_t*>(page.mapped) + p.offset + e * p.slice);
            } else {
                std::vector<uint8_t> packed(wl.bytes, 0);
                repackMatrix(d.dtype, src, d.ne[0], d.ne[1], wl, packed.data());
                BLUE_TRY(uploadToBuffer(dev, page, p.offset + e * p.slice, packed.data(), packed.size()));
            }
        }
    }
    if (opt.on_load) opt.on_load(total, total);
    return Status::ok();
}

Status GpuMachine::Impl::createDescriptors() {
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 2 + BLUE_MAX_PAGES};
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = 1;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &size;
    BLUE_VK_TRY_ON(dev, vkCreateDescriptorPool(dev.device(), &pi, nullptr, &pool));
    VkDescriptorSetLayout sl = pipelines.setLayout();
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = pool;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &sl;
    BLUE_VK_TRY_ON(dev, vkAllocateDescriptorSets(dev.device(), &ai, &set));
    VkDescriptorBufferInfo ctl_info{control.buffer, 0, VK_WHOLE_SIZE};
    VkDescriptorBufferInfo io_info{io.buffer, 0, VK_WHOLE_SIZE};
    std::vector<VkDescriptorBufferInfo> page_info(BLUE_MAX_PAGES);
    for (uint32_t p = 0; p < BLUE_MAX_PAGES; ++p) {
        // Unused slots point at the I/O buffer; kernels never index them. Nor host pages whose
        // weights stream: only copies read those.
        // Experts kept for the caches are read in place: their pages stay bound.
        const bool streamed = !streams.groups.empty() && p < pages.page_tier.size() && pages.page_tier[p] == 1 &&
                              !(p < pages.page_experts.size() && pages.page_experts[p]);
        const Buffer& b = p < page_buffers.size() && !streamed ? page_buffers[p] : io;
        page_info[p] = {b.buffer, 0, VK_WHOLE_SIZE};
    }
    VkWriteDescriptorSet writes[3] = {};
    const uint32_t bindings[3] = {BLUE_BIND_CONTROL, BLUE_BIND_PAGES, BLUE_BIND_IO};
    const VkDescriptorBufferInfo* infos[3] = {&ctl_info, page_info.data(), &io_info};
    for (int i = 0; i < 3; ++i) {
        writes[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        writes[i].dstSet = set;
        writes[i].dstBinding = bindings[i];
        writes[i].descriptorCount = bindings[i] == BLUE_BIND_PAGES ? BLUE_MAX_PAGES : 1;
        writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        writes[i].pBufferInfo = infos[i];
    }
    vkUpdateDescriptorSets(dev.device(), 3, writes, 0, nullptr);
    return createOperandSets();
}

// One set-1 descriptor set per distinct combination of operand pages.
Status GpuMachine::Impl::createOperandSets() {
    if (dispatches.empty()) return Status::ok();
    std::map<std::array<uint32_t, BLUE_MAX_TEX_OPERANDS>, VkDescriptorSet> unique;
    for (const DispatchDesc& d : dispatches) unique[d.operand_pages] = VK_NULL_HANDLE;
    uint32_t n = uint32_t(unique.size());
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER, n * BLUE_MAX_TEX_OPERANDS};
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = n;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &size;
    BLUE_VK_TRY_ON(dev, vkCreateDescriptorPool(dev.device(), &pi, nullptr, &operand_pool));
    std::vector<VkDescriptorSetLayout> layouts(n, pipelines.operandLayout());
    std::vector<VkDescriptorSet> sets(n);
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = operand_pool;
    ai.descriptorSetCount = n;
    ai.pSetLayouts = layouts.data();
    BLUE_VK_TRY_ON(dev, vkAllocateDescriptorSets(dev.device(), &ai, sets.data()));
    uint32_t k = 0;
    for (auto& [pages_of, s] : unique) {
        s = sets[k++];
        std::array<VkBufferView, BLUE_MAX_TEX_OPERANDS> views;
        for (uint32_t i = 0; i < BLUE_MAX_TEX_OPERANDS; ++i) {
            views[i] = page_views[pages_of[i] < page_views.size() ? pages_of[i] : 0];
        }
        VkWriteDescriptorSet w{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
        w.dstSet = s;
        w.dstBinding = 0;
        w.descriptorCount = BLUE_MAX_TEX_OPERANDS;
        w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER;
        w.pTexelBufferView = views.data();
        vkUpdateDescriptorSets(dev.device(), 1, &w, 0, nullptr);
    }
    for (const DispatchDesc& d : dispatches) operand_sets.push_back(unique[d.operand_pages]);
    return Status::ok();
}

void GpuMachine::Impl::publishInput(uint32_t chain) {
    uint32_t* w = ioWords();
    const uint32_t slots = m.layout.in_slots;
    const uint32_t slot_words = m.layout.in_slot_words;
    const uint32_t state = layout.at(BLUE_H_IO_SLOTSTATE);
    for (uint32_t s = 0; s < slots && !pending.empty(); ++s) {
        if (w[state + s] != BLUE_IO_SLOT_FREE) continue;
        const std::vector<uint32_t>& msg = pending.front();
        uint32_t base = layout.at(BLUE_H_IO_SLOTS) + s * slot_words;
        w[base] = uint32_t(msg.size());
        std::copy(msg.begin(), msg.end(), w + base + 1);
        w[state + s] = BLUE_IO_SLOT_FULL;
        w[layout.at(BLUE_H_IO_ORDER) + published % slots] = s;
        ++published;
        pending.pop_front();
    }
    uint32_t* stage = w + chain * BLUE_IO_STAGE_WORDS;
    stage[0] = uint32_t(published);
    stage[1] = input_closed && pending.empty() ? 1u : 0u;
    stage[2] = uint32_t(out_tail);
}

void GpuMachine::Impl::drainOutput(uint32_t chain, const OutputSink& sink, bool keep,
                                   RunReport* report, GpuStats* stats) {
    keep = keep && report;
    const uint32_t* w = ioWords();
    const uint32_t* snap = w + BLUE_IO_SNAP_BASE + chain * BLUE_IO_SNAP_WORDS;
    uint32_t head = snap[BLUE_C_OUT_HEAD - BLUE_C_CYCLE];
    const uint32_t cap = opt.out_records;
    const uint32_t ring = layout.at(BLUE_H_IO_OUT);
    std::vector<OutputRecord> batch;
    for (uint32_t t = uint32_t(out_tail); t != head; ++t) {
        uint32_t rec = ring + (t % cap) * 2;
        batch.push_back({w[rec] & BLUE_OUT_INST_MASK, w[rec] >> 24, w[rec + 1]});
    }
    out_tail = head;
    stats->output_records += batch.size();
    if (sink && !batch.empty()) sink(batch);
    if (keep) report->output.insert(report->output.end(), batch.begin(), batch.end());
}

Status GpuMachine::Impl::readInstances(RunReport* report, GpuStats* stats) {
    std::vector<uint32_t> state(size_t(opt.instances) * BLUE_STATE_WORDS);
    BLUE_TRY(downloadFromBuffer(dev, control, VkDeviceSize(layout.at(BLUE_O_STATE)) * 4,
                                state.data(), state.size() * 4));
    report->instances.clear();
    stats->steps = 0;
    for (uint32_t i = 0; i < opt.instances; ++i) {
        const uint32_t* s = state.data() + size_t(i) * BLUE_STATE_WORDS;
        report->instances.push_back({s[BLUE_S_PC], s[BLUE_S_STATUS], s[BLUE_S_FAULT]});
        stats->steps += uint64_t(s[BLUE_S_STEPS_HI]) << 32 | s[BLUE_S_STEPS_LO];
    }
    return Status::ok();
}

GpuMachine::GpuMachine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuMachine::~GpuMachine() = default;

namespace {

// A kernel choice left to the environment: `var` set to `no` or `yes` decides, unset leaves
// `fallback`, anything else is refused naming the variable.
Result<bool> envChoice(const char* var, const char* no, const char* yes, bool fallback) {
    const char* env = std::getenv(var);
    const std::string want = env ? env : "";
    if (want.empty()) return fallback;
    if (want == no) return false;
    if (want == yes) return true;
    return BLUE_ERROR("%s is '%s': it takes '%s' or '%s'", var, want.c_str(), no, yes);
}

// The kernel shapes of a machine with `options` on this device (GpuOptions::decode_kernel: split
// K and shared-memory tiles on GPUs, lanes over rows on CPU drivers; attn_kernel: a workgroup per
// head on GPUs, a lane per head on CPU drivers).
Result<KernelChoice> chooseKernels(const GpuOptions& options, const DeviceInfo& info) {
    using DK = GpuOptions::DecodeKernel;
    using AK = GpuOptions::AttnKernel;
    KernelChoice k;
    if (options.decode_kernel == DK::AUTO) {
        Result<bool> split = envChoice("BLUE_DECODE_KERNEL", "rows", "split", !info.cpu);
        if (!split) return split.status();
        k.split_matmul = split.value();
    } else {
        k.split_matmul = options.decode_kernel == DK::SPLIT;
    }
    if (options.attn_kernel == AK::AUTO) {
        Result<bool> split = envChoice("BLUE_ATTN_KERNEL", "lanes", "split", !info.cpu);
        if (!split) return split.status();
        k.split_attn = split.value();
    } else {
        k.split_attn = options.attn_kernel == AK::SPLIT;
    }
    // lavapipe (llvmpipe's gallivm) stops every loop of an invocation once 65535 iterations have
    // run in it, silently: the plan keeps each kernel's worst case under that.
    k.loop_limit = deviceLoopLimit(info.cpu);
    k.sample_history = options.sample_history;
    using IM = GpuOptions::Int8Matmul;
    if (options.int8_matmul == IM::AUTO) {
        // (A profile may turn the feature off and leave the property: both must hold.)
        Result<bool> int8 = envChoice("BLUE_MATMUL_INT8", "0", "1", info.int_dot && info.int_dot_accelerated);
        if (!int8) return int8.status();
        k.int8_matmul = int8.value();
    } else {
        k.int8_matmul = options.int8_matmul == IM::ON;
    }
    if (k.int8_matmul && !info.int_dot) {
        return BLUE_ERROR("the int8 GEMM (BLUE_MATMUL_INT8=1) needs integer dot products "
                          "(VK_KHR_shader_integer_dot_product, shaderIntegerDotProduct), which device %s does not offer",
                          info.name.c_str());
    }
    Result<bool> fuse = envChoice("BLUE_FUSE", "0", "1", true);
    if (!fuse) return fuse.status();
    k.fuse = fuse.value();
    k.gemm_min_items = defaultGemmMinItems(k.split_matmul);
    if (const char* env = std::getenv("BLUE_GEMM_MIN_ITEMS"); env && *env) {
        char* end = nullptr;
        const unsigned long v = std::strtoul(env, &end, 10);
        if (*end != '\0' || v < 2 || v > 65535) {
            return BLUE_ERROR("BLUE_GEMM_MIN_ITEMS is '%s': it takes a count of items from 2 to 65535", env);
        }
        k.gemm_min_items = uint32_t(v);
        k.gemm_min_items_given = true;
    }
    return k;
}

}  // namespace

Result<std::string> describeKernelShapes(const GpuOptions& options, const DeviceInfo& info) {
    const Result<KernelChoice> k = chooseKernels(options, info);
    if (!k) return k.status();
    const uint32_t g = k->gemm_min_items, gi = itemsGemmMinItems(k.value());
    const std::string cpu_gemm =
        gi == g ? strFormat("lanes over rows for 1-%u items, lanes over items (block types) or register tiles (F32, F16, "
                            "BF16) for %u+", g - 1, g)
                : strFormat("lanes over rows for 1-%u items (block types: 1-%u), register tiles (F32, F16, BF16) for "
                            "%u+, lanes over items (block types) for %u+", g - 1, gi - 1, g, gi);
    return std::string("matmul: ") +
           (k->split_matmul ? strFormat("split K for 1-%u items, shared-memory tiles for %u+ (GPU shapes)", g - 1, g)
                            : cpu_gemm + ", 16-64 lanes a workgroup by the matrix's rows (CPU-driver shapes)") +
           (k->int8_matmul ? std::string("; block types' GEMM: int8 (x quantized per 32 elements, packed integer dot "
                                         "products") +
                                 (info.int_dot_accelerated ? "" : ", not accelerated on this device") +
                                 (k->split_matmul ? ""
                                                  : "; on CPU-driver shapes only Q4_0, Q4_K, Q5_K and Q6_K: "
                                                    "integer SWAR on x packed once per input (PACKX), for "
                                                    "every item count") +
                                 ")"
                           : std::string("")) +
           "; attention: " + (k->split_attn ? "a workgroup per head" : "a lane per head") +
           (k->loop_limit != 0 ? strFormat("; sampling: 8-64 lanes up to %u tokens, else 8-256, the fewest whose walks fit the loop limit over the model's context", kNarrowSampleVocab) : "") +
           (k->fuse ? "; fused: matmuls over one x (a layer's Q, K and V) as one, RoPE with the KV store" : "");
}

Result<std::unique_ptr<GpuMachine>> GpuMachine::create(Device& dev, Pipelines& pipelines,
                                                       const Module& m, const WeightSource& weights,
                                                       const GpuOptions& options) {
    if (options.instances == 0 || options.instances > BLUE_MAX_INSTANCES) {
        return BLUE_ERROR("--instances must be between 1 and %u", BLUE_MAX_INSTANCES);
    }
    if (options.chains == 0 || options.chains > BLUE_MAX_CHAINS || options.chain_cycles == 0) {
        return BLUE_ERROR("chains must be 1..%u and chain cycles at least 1", BLUE_MAX_CHAINS);
    }
    if (options.heap_watch >= 0 && uint64_t(options.heap_watch) + BLUE_IO_SNAP3_WORDS > m.layout.heap_words) {
        return BLUE_ERROR("heap words %lld..%lld to watch are past the module's heap of %u words",
                          (long long)options.heap_watch, (long long)options.heap_watch + BLUE_IO_SNAP3_WORDS - 1,
                          m.layout.heap_words);
    }
    if (dev.lost()) return Status::error("the device was lost earlier (" + dev.lostReason() + ")");
    auto impl = std::make_unique<Impl>(dev, pipelines, m, options);
    const uint64_t page_limit = dev.maxPlanPageBytes();
    const Result<KernelChoice> chosen = chooseKernels(options, dev.info());
    if (!chosen) return chosen.status();
    const KernelChoice kernels = chosen.value();
    // The int8 kernels of CPU drivers (Q4_0, Q4_K, Q5_K, Q6_K) read x packed once per input (planPackedX).
    const bool packed_x = kernels.int8_matmul && !kernels.split_matmul;
    Result<PagePlan> pages = planPages(m, options.instances, page_limit, 0, false, true, kernels.fuse);
    if (!pages) return pages.status();
    if (packed_x) BLUE_TRY(planPackedX(m, options.instances, page_limit, &pages.value()));
    impl->pages = std::move(pages.value());
    auto dispatches = planDispatches(m, impl->pages, dev.info().max_workgroup_count[0], kernels);
    if (!dispatches) return dispatches.status();
    impl->dispatches = std::move(dispatches.value());
    auto layout = planControl(m, options, uint32_t(impl->dispatches.size()), dev.maxBindingBytes());
    if (!layout) return layout.status();
    impl->layout = layout.value();
    if (options.vram_budget > 0) {
        // The control buffer is device-local too; the dispatches (and so its size) do not
        // depend on which tier a weight is in.
        // So is the int8 GEMM's packed x (planPackedX), which the budget's plan below leaves out.
        const PackedX& px = impl->pages.packed_x;
        const uint64_t control = impl->layout.control_words * 4 + (px.item_bytes ? px.bytes() + 256 : 0);
        if (control >= options.vram_budget) {
            return BLUE_ERROR("the control buffer%s for %u instances needs %.1f MiB of device memory, "
                              "more than the VRAM budget of %.1f MiB",
                              px.item_bytes ? " and the int8 GEMM's packed x" : "", options.instances,
                              double(control) / (1 << 20),
                              double(options.vram_budget) / (1 << 20));
        }
        using HW = GpuOptions::HostWeights;
        const bool stream = options.host_weights == HW::STREAM ||
                            (options.host_weights == HW::AUTO && dev.hasHostOnlyMemory());
        pages = planPages(m, options.instances, page_limit, options.vram_budget - control, stream,
                          options.expert_cache, kernels.fuse);
        if (!pages) return pages.status();
        if (!pages->expert_caches.empty()) {
            // Expert caches add state words and copy dispatches to the control buffer: plan
            // again with room for them (fewer slots need fewer words).
            uint64_t words = pages->expertStateWords();
            for (const ExpertCache& c : pages->expert_caches) words += c.tensors.size() * (BLUE_DISPATCH_WORDS + 3);
            if (control + words * 4 >= options.vram_budget) {
                return BLUE_ERROR("the control buffer and the expert caches' state need %.1f MiB of device "
                                  "memory, more than the VRAM budget of %.1f MiB",
                                  double(control + words * 4) / (1 << 20), double(options.vram_budget) / (1 << 20));
            }
            pages = planPages(m, options.instances, page_limit, options.vram_budget - control - words * 4,
                              stream, options.expert_cache, kernels.fuse);
            if (!pages) return pages.status();
        }
        if (packed_x) BLUE_TRY(planPackedX(m, options.instances, page_limit, &pages.value()));
        impl->pages = std::move(pages.value());
        dispatches = planDispatches(m, impl->pages, dev.info().max_workgroup_count[0], kernels);
        if (!dispatches) return dispatches.status();
        impl->dispatches = std::move(dispatches.value());
        if (stream) {
            impl->streams = planStreams(impl->pages, &impl->dispatches, uint32_t(impl->pages.page_bytes.size()));
        }
        layout = planControl(m, options, uint32_t(impl->dispatches.size()), dev.maxBindingBytes(),
                             impl->pages.expertStateWords());
        if (!layout) return layout.status();
        impl->layout = layout.value();
    }
    // lavapipe ends every loop of an invocation after kernels.loop_limit iterations: a cycle's
    // steps are capped so the sequencer's walks keep room (an instance goes on next cycle).
    impl->layout.header[BLUE_H_MAX_STEPS] =
        std::min(impl->layout.header[BLUE_H_MAX_STEPS], maxCycleSteps(kernels.loop_limit));
    BLUE_TRY(checkDeviceFit(impl->pages, impl->layout, options.instances,
                            dev.info().device_local_bytes, dev.info().max_workgroup_count[0]));
    BLUE_TRY(impl->allocate());
    BLUE_TRY(impl->initControl());
    BLUE_TRY(impl->uploadWeights(weights));
    BLUE_TRY(impl->createDescriptors());
    BLUE_TRY(impl->createCustomKernels());

    BLUE_TRY(impl->createChains());
    pipelines.saveCache();
    std::unique_ptr<GpuMachine> machine(new GpuMachine(std::move(impl)));
    machine->stats_.instances = options.instances;
    machine->stats_.vram_bytes = machine->impl_->layout.control_words * 4 + machine->impl_->pages.tierBytes(0);
    machine->stats_.host_weight_bytes = machine->impl_->pages.tierBytes(1);
    machine->stats_.streaming = !machine->impl_->streams.groups.empty();
    machine->stats_.stream_bytes_per_cycle = machine->impl_->streams.bytesPerCycle();
    if (machine->stats_.streaming) machine->stats_.vram_bytes += 2 * machine->impl_->pages.slot_bytes;
    for (const ExpertCache& c : machine->impl_->pages.expert_caches) {
        machine->stats_.expert_cache_slots = c.slots;
        for (const TensorPlace& p : c.caches) machine->stats_.expert_cache_bytes += p.bytes;
    }
    machine->stats_.chain_cycles = options.chain_cycles;
    machine->stats_.chain_cycles_now = machine->impl_->cycles_now;
    machine->stats_.chain_cycles_min = machine->impl_->cycles_now;
    return machine;
}

Status GpuMachine::pushInput(std::vector<uint32_t> message) {
    const Layout& l = impl_->m.layout;
    if (l.in_slots == 0)
        return Status::error("this program reads no input (its layout has in_slots=0)");
    if (message.size() + 1 > l.in_slot_words) {
        return BLUE_ERROR("input message of %zu words is longer than an input slot (%u words)",
                          message.size(), l.in_slot_words - 1);
    }
    impl_->pending.push_back(std::move(message));
    return Status::ok();
}

void GpuMachine::closeInput() {
    impl_->input_closed = true;
}

Status GpuMachine::Impl::submit(GpuStats* stats) {
    VkDevice d = dev.device();
    uint32_t c = next_chain;
    if (stats->submits > 0 && inflight.empty()) ++(paused ? stats->resumes : stats->round_trips);
    paused = false;
    for (uint32_t o : inflight) {
        if (vkGetFenceStatus(d, fences[o]) == VK_SUCCESS) ++stats->queue_drains;
    }
    if (stats->submits == 0) started = std::chrono::steady_clock::now();
    if (chain_len[c] != cycles_now) {  // the watchdog bound asked for another length
        BLUE_TRY(recordChain(c));
        ++stats->chain_rerecords;
    }
    publishInput(c);
    BLUE_VK_TRY_ON(dev, vkResetFences(d, 1, &fences[c]));
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &chains[c];
    BLUE_VK_TRY_ON(dev, vkQueueSubmit(dev.queue(), 1, &si, fences[c]));
    inflight.push_back(c);
    next_chain = (c + 1) % uint32_t(chains.size());
    ++stats->submits;
    stats->cycles_submitted += chain_len[c];
    stats->dispatches_recorded += chain_dispatches[c];
    return Status::ok();
}

Result<bool> GpuMachine::pump(const OutputSink& sink, bool keep_going, RunReport* report) {
    Impl& im = *impl_;
    if (!keep_going) im.paused = true;
    if (im.dev.lost())
        return Status::error("the device was lost earlier (" + im.dev.lostReason() + ")");
    while (keep_going && !im.gpu_done && im.inflight.size() < im.chains.size()) {
        const uint32_t c = im.next_chain;
        if (Status s = im.submit(&stats_); !s)
            return Status::error(s.message() + strFormat(" in chain %u", c));
    }
    if (im.inflight.empty()) return false;
    uint32_t c = im.inflight.front();
    im.inflight.pop_front();
    auto wait = [&]() -> Status {
        BLUE_VK_TRY_ON(im.dev,
                       vkWaitForFences(im.dev.device(), 1, &im.fences[c], VK_TRUE, UINT64_MAX));
        return Status::ok();
    };
    if (Status s = wait(); !s) return Status::error(s.message() + strFormat(" in chain %u", c));
    ++stats_.host_waits;
    BLUE_TRY(im.collectProfile(c));
    BLUE_TRY(im.timeChain(c, &stats_));
    im.drainOutput(c, sink, report != nullptr, report, &stats_);
    const uint32_t* snap = im.ioWords() + BLUE_IO_SNAP_BASE + c * BLUE_IO_SNAP_WORDS;
    stats_.cycles = snap[0];
    stats_.block_runs = snap[BLUE_C_BLOCK_RUNS - BLUE_C_CYCLE];
    const uint32_t* snap2 = im.ioWords() + BLUE_IO_SNAP2_BASE + c * BLUE_IO_SNAP2_WORDS;
    stats_.expert_bytes = (uint64_t(snap2[1]) << 32 | snap2[0]) * 16;
    stats_.expert_hits = snap2[BLUE_C_XC_HITS - BLUE_C_MOE_TEXELS_LO];
    stats_.expert_misses = snap2[BLUE_C_XC_MISSES - BLUE_C_MOE_TEXELS_LO];
    stats_.expert_inplace = snap2[BLUE_C_XC_INPLACE - BLUE_C_MOE_TEXELS_LO];
    if (im.opt.heap_watch >= 0) {
        const uint32_t* snap3 = im.ioWords() + BLUE_IO_SNAP3_BASE + c * BLUE_IO_SNAP3_WORDS;
        std::copy(snap3, snap3 + BLUE_IO_SNAP3_WORDS, stats_.heap_watch.begin());
    }
    stats_.expert_paged_bytes = (uint64_t(snap2[BLUE_C_XC_TEXELS_HI - BLUE_C_MOE_TEXELS_LO]) << 32 |
                                 snap2[BLUE_C_XC_TEXELS_LO - BLUE_C_MOE_TEXELS_LO]) * 16;
    uint32_t live = snap[BLUE_C_LIVE - BLUE_C_CYCLE];
    im.gpu_done = live == 0 || snap[0] >= im.layout.at(BLUE_H_MAX_CYCLES);
    stats_.wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - im.started)
            .count();
    if (im.opt.record_clock) clock_.push_back({stats_.cycles, stats_.wall_ms});
    return true;
}

bool GpuMachine::gpuDone() const {
    return impl_->gpu_done;
}
bool GpuMachine::inFlight() const {
    return !impl_->inflight.empty();
}

void GpuMachine::setFlag(uint32_t index, uint32_t value) {
    if (index >= impl_->opt.instances) return;
    // A host-visible coherent word: the GPU sees it at the latest with the next submitted chain.
    impl_->ioWords()[impl_->layout.at(BLUE_H_IO_FLAGS) + index] = value;
}

size_t GpuMachine::pendingInput() const {
    return impl_->pending.size();
}

Result<RunReport> GpuMachine::run(const OutputSink& sink, bool keep_output) {
    RunReport report;
    for (;;) {
        Result<bool> progressed = pump(sink, true, keep_output ? &report : nullptr);
        if (!progressed) return progressed.status();
        if (!progressed.value()) break;
    }
    Impl& im = *impl_;
    BLUE_TRY(im.readInstances(&report, &stats_));
    stats_.profile = im.profile;
    report.cycles = stats_.cycles;
    report.steps = stats_.steps;
    report.block_runs = stats_.block_runs;
    bool live = false;
    for (const InstanceReport& r : report.instances) {
        live |= r.status == BLUE_ST_RUNNING || r.status == BLUE_ST_PARKED;
    }
    if (live) report.status = Status::error(describeUnfinished(report.instances, stats_.cycles));
    return report;
}

Status GpuMachine::readTensor(uint32_t index, std::vector<uint8_t>* out) {
    if (index >= impl_->pages.places.size()) {
        return BLUE_ERROR("tensor %u is out of range (the module has %zu)", index,
                          impl_->pages.places.size());
    }
    const TensorPlace& p = impl_->pages.places[index];
    const TensorDecl& t = impl_->m.tensors[index];
    if (p.repacked) {
        return BLUE_ERROR("tensor '%s' is held in the GPU weight layout; read it from its source",
                          t.name.c_str());
    }
    std::vector<uint8_t> raw(p.bytes);
    Status s =
        downloadFromBuffer(impl_->dev, impl_->page_buffers[p.page], p.offset, raw.data(), p.bytes);
    if (!s.isOk()) return s;
    // Slices are padded to whole texels on the GPU; hand back the reference machine's packing.
    const uint64_t natural = tensorSliceBytes(t), count = p.slice ? p.bytes / p.slice : 0;
    out->resize(natural * count);
    for (uint64_t i = 0; i < count; ++i) {
        std::memcpy(out->data() + i * natural, raw.data() + i * p.slice, natural);
    }
    return Status::ok();
}

namespace {

// Where `bytes` bytes from `offset` of instance `inst`'s slice of `tensor` lie in its page.
Result<uint64_t> instanceRange(const Module& m, const PagePlan& pages, uint32_t instances, uint32_t tensor,
                               uint32_t inst, uint64_t offset, uint64_t bytes) {
    if (tensor >= m.tensors.size()) return BLUE_ERROR("tensor %u is out of range (the module has %zu)", tensor, m.tensors.size());
    const TensorDecl& t = m.tensors[tensor];
    if (t.cls != BLUE_TC_INSTANCE && t.cls != BLUE_TC_GLOBAL) {
        return BLUE_ERROR("tensor '%s' is neither an INSTANCE nor a GLOBAL tensor", t.name.c_str());
    }
    if (t.cls == BLUE_TC_GLOBAL && inst != 0) {
        return BLUE_ERROR("tensor '%s' is GLOBAL: one copy, instance 0 (not %u)", t.name.c_str(), inst);
    }
    if (inst >= instances) return BLUE_ERROR("instance %u is out of range (the machine has %u)", inst, instances);
    const uint64_t natural = tensorSliceBytes(t);
    if (offset > natural || bytes > natural - offset) {
        return BLUE_ERROR("bytes [%llu, +%llu) are outside tensor '%s' (%llu bytes per instance)",
                          (unsigned long long)offset, (unsigned long long)bytes, t.name.c_str(),
                          (unsigned long long)natural);
    }
    const TensorPlace& p = pages.places[tensor];
    return p.offset + uint64_t(inst) * p.slice + offset;
}

}  // namespace

Result<uint64_t> GpuMachine::localBytes(uint32_t inst, uint32_t word, size_t n, const char* verb) const {
    const Impl& im = *impl_;
    const uint64_t words = im.m.layout.local_words;
    if (!im.inflight.empty()) return Status::error(std::string("instance memory is ") + verb + " between runs only");
    if (inst >= im.opt.instances || word > words || n > words - word) {
        return BLUE_ERROR("local words [%u, +%zu) of instance %u are outside its memory", word, n, inst);
    }
    return (im.layout.at(BLUE_O_LOCAL) + uint64_t(inst) * words + word) * 4;
}

Status GpuMachine::readLocal(uint32_t inst, uint32_t word, std::span<uint32_t> out) {
    BLUE_TRY_ASSIGN(uint64_t at, localBytes(inst, word, out.size(), "read"));
    if (out.empty()) return Status::ok();
    return downloadFromBuffer(impl_->dev, impl_->control, at, out.data(), out.size() * 4);
}

Status GpuMachine::writeLocal(uint32_t inst, uint32_t word, std::span<const uint32_t> in) {
    BLUE_TRY_ASSIGN(uint64_t at, localBytes(inst, word, in.size(), "written"));
    if (in.empty()) return Status::ok();
    return uploadToBuffer(impl_->dev, impl_->control, at, in.data(), in.size() * 4);
}

Status GpuMachine::readInstanceTensor(uint32_t tensor, uint32_t inst, uint64_t offset, std::span<uint8_t> out) {
    Impl& im = *impl_;
    if (!im.inflight.empty()) return Status::error("instance memory is read between runs only");
    Result<uint64_t> at = instanceRange(im.m, im.pages, im.opt.instances, tensor, inst, offset, out.size());
    if (!at) return at.status();
    if (out.empty()) return Status::ok();
    return downloadFromBuffer(im.dev, im.page_buffers[im.pages.places[tensor].page], at.value(), out.data(), out.size());
}

Status GpuMachine::writeInstanceTensor(uint32_t tensor, uint32_t inst, uint64_t offset,
                                       std::span<const uint8_t> in) {
    Impl& im = *impl_;
    if (!im.inflight.empty()) return Status::error("instance memory is written between runs only");
    Result<uint64_t> at = instanceRange(im.m, im.pages, im.opt.instances, tensor, inst, offset, in.size());
    if (!at) return at.status();
    if (in.empty()) return Status::ok();
    return uploadToBuffer(im.dev, im.page_buffers[im.pages.places[tensor].page], at.value(), in.data(), in.size());
}

std::string formatProfile(const GpuStats& stats) {
    std::vector<KernelTime> rows;
    double total = 0;
    for (const KernelTime& k : stats.profile) {
        if (k.dispatches == 0) continue;
        rows.push_back(k);
        total += k.ms;
    }
    std::sort(rows.begin(), rows.end(),
              [](const KernelTime& a, const KernelTime& b) { return a.ms > b.ms; });
    std::string out = strFormat("%-16s %10s %10s %12s %7s\n", "kernel", "dispatches", "total ms",
                                "us/dispatch", "share");
    for (const KernelTime& k : rows) {
        out +=
            strFormat("%-16s %10llu %10.2f %12.2f %6.1f%%\n", k.name.c_str(),
                      (unsigned long long)k.dispatches, k.ms, 1000.0 * k.ms / double(k.dispatches),
                      total > 0 ? 100.0 * k.ms / total : 0.0);
    }
    out += strFormat("%-16s %10s %10.2f\n", "total", "", total);
    return out;
}

std::string GpuStats::json() const {
    using ull = unsigned long long;
    return strFormat(
        "{\"submits\":%llu,\"cycles\":%llu,\"cycles_submitted\":%llu,\"chain_cycles\":%u,"
        "\"chain_cycles_now\":%u,\"chain_cycles_min\":%u,\"chain_rerecords\":%llu,"
        "\"submit_ms_max\":%.3f,\"submit_ms_mean\":%.3f,"
        "\"dispatches_recorded\":%llu,\"host_waits\":%llu,\"round_trips\":%llu,"
        "\"queue_drains\":%llu,\"resumes\":%llu,\"steps\":%llu,\"block_runs\":%llu,"
        "\"output_records\":%llu,\"expert_bytes\":%llu,\"vram_bytes\":%llu,\"host_weight_bytes\":%llu,"
        "\"streamed_bytes\":%llu,\"expert_cache_slots\":%u,\"expert_cache_bytes\":%llu,"
        "\"expert_hits\":%llu,\"expert_misses\":%llu,\"expert_inplace\":%llu,"
        "\"expert_paged_bytes\":%llu,\"instances\":%u,\"wall_ms\":%.3f}",
        ull(submits), ull(cycles), ull(cycles_submitted), chain_cycles, chain_cycles_now,
        chain_cycles_min, ull(chain_rerecords), submit_ms_max,
        submits_timed ? submit_ms_total / double(submits_timed) : 0.0, ull(dispatches_recorded),
        ull(host_waits), ull(round_trips), ull(queue_drains), ull(resumes), ull(steps),
        ull(block_runs), ull(output_records), ull(expert_bytes), ull(vram_bytes),
        ull(host_weight_bytes), ull(stream_bytes_per_cycle * cycles_submitted), expert_cache_slots,
        ull(expert_cache_bytes), ull(expert_hits), ull(expert_misses), ull(expert_inplace),
        ull(expert_paged_bytes), instances, wall_ms);
}

}  // namespace blue
