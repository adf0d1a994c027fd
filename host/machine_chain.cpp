// GpuMachine's chains: recording, the barriers derived from what each command uses, GPU timing
// of every submission, and the chain length that keeps one submission under the watchdog bound.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "host/machine_impl.h"
#include "host/sync.h"
#include "host/vk_check.h"
#include "vm/kernel_abi.h"

namespace blue {

namespace {

// The resources a chain touches. Every dispatch binds all of them (set 0), so each counts as
// reading and writing all three; the pages are also read through texel views (set 1).
// Streaming adds the two weight slots (read by the dispatches of their groups through set 1 only)
// and the host pages their copies read (bound to no kernel while weights stream).
enum ChainResource : uint32_t { kControl, kIo, kPages, kSlot0, kSlot1, kHostPages, kChainResources };

constexpr VkPipelineStageFlags kCompute = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
constexpr VkPipelineStageFlags kTransfer = VK_PIPELINE_STAGE_TRANSFER_BIT;
constexpr VkAccessFlags kShaderRW = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;

// What each command of a chain reads and writes: the one description every barrier in a chain
// is derived from (host/sync.h). A new kind of command adds its row here.
constexpr SyncUse kStageIn[] = {  // I/O staging quarter -> control counters
    {kIo, kTransfer, VK_ACCESS_TRANSFER_READ_BIT},
    {kControl, kTransfer, VK_ACCESS_TRANSFER_WRITE_BIT}};
constexpr SyncUse kDispatch[] = {
    {kControl, kCompute, kShaderRW}, {kIo, kCompute, kShaderRW}, {kPages, kCompute, kShaderRW}};
constexpr SyncUse kDispatchIndirect[] = {
    {kControl, VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, VK_ACCESS_INDIRECT_COMMAND_READ_BIT},
    {kControl, kCompute, kShaderRW},
    {kIo, kCompute, kShaderRW},
    {kPages, kCompute, kShaderRW}};
constexpr SyncUse kBlockPredicate[] = {  // a block's instance count, which gates its dispatches
    {kControl, VK_PIPELINE_STAGE_CONDITIONAL_RENDERING_BIT_EXT, VK_ACCESS_CONDITIONAL_RENDERING_READ_BIT_EXT}};
constexpr SyncUse kSnapshotOut[] = {  // control counters -> this chain's I/O snapshot
    {kControl, kTransfer, VK_ACCESS_TRANSFER_READ_BIT},
    {kIo, kTransfer, VK_ACCESS_TRANSFER_WRITE_BIT}};
constexpr SyncUse kStreamCopy[2][2] = {  // host page -> slot
    {{kHostPages, kTransfer, VK_ACCESS_TRANSFER_READ_BIT}, {kSlot0, kTransfer, VK_ACCESS_TRANSFER_WRITE_BIT}},
    {{kHostPages, kTransfer, VK_ACCESS_TRANSFER_READ_BIT}, {kSlot1, kTransfer, VK_ACCESS_TRANSFER_WRITE_BIT}}};
constexpr SyncUse kDispatchIndirectSlot[2][5] = {  // a dispatch reading its matrix from a slot
    {{kControl, VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, VK_ACCESS_INDIRECT_COMMAND_READ_BIT},
     {kControl, kCompute, kShaderRW}, {kIo, kCompute, kShaderRW}, {kPages, kCompute, kShaderRW},
     {kSlot0, kCompute, VK_ACCESS_SHADER_READ_BIT}},
    {{kControl, VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, VK_ACCESS_INDIRECT_COMMAND_READ_BIT},
     {kControl, kCompute, kShaderRW}, {kIo, kCompute, kShaderRW}, {kPages, kCompute, kShaderRW},
     {kSlot1, kCompute, VK_ACCESS_SHADER_READ_BIT}}};
constexpr SyncUse kHostReads[] = {  // after the fence: rings, snapshots, and mapped buffers
    {kIo, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT},
    {kControl, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT},
    {kPages, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT}};

// Records into `cb`, or only advances the barrier state when `cb` is null (a dry run).
struct ChainWriter {
    VkCommandBuffer cb;
    SyncTracker& sync;
    VkPipelineLayout layout;

    void copy(std::span<const SyncUse> uses, VkBuffer src, VkBuffer dst, VkBufferCopy region) {
        sync.use(cb, uses);
        if (cb) vkCmdCopyBuffer(cb, src, dst, 1, &region);
    }
    // One command per source page.
    void copies(std::span<const SyncUse> uses, const std::vector<std::pair<VkBuffer, VkBufferCopy>>& regions,
                VkBuffer dst) {
        sync.use(cb, uses);
        if (cb) {
            for (const auto& [src, region] : regions) vkCmdCopyBuffer(cb, src, dst, 1, &region);
        }
    }
    void dispatch(VkPipeline p) {
        sync.use(cb, kDispatch);
        if (!cb) return;
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
        vkCmdDispatch(cb, 1, 1, 1);
    }
    // Dispatches until endCondition run only when the word at `offset` of `buffer` is not zero.
    void beginCondition(VkBuffer buffer, VkDeviceSize offset) {
        sync.use(cb, kBlockPredicate);
        if (!cb) return;
        VkConditionalRenderingBeginInfoEXT ci{VK_STRUCTURE_TYPE_CONDITIONAL_RENDERING_BEGIN_INFO_EXT};
        ci.buffer = buffer;
        ci.offset = offset;
        vkCmdBeginConditionalRenderingEXT(cb, &ci);
    }
    void endCondition() {
        if (cb) vkCmdEndConditionalRenderingEXT(cb);
    }
    void dispatchIndirect(VkPipeline p, VkBuffer args, VkDeviceSize offset, int32_t slot = -1) {
        if (slot >= 0) {
            sync.use(cb, kDispatchIndirectSlot[slot]);
        } else {
            sync.use(cb, kDispatchIndirect);
        }
        if (!cb) return;
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
        vkCmdDispatchIndirect(cb, args, offset);
    }
};

// Valid bits of the queue's timestamps (0: the queue cannot time commands).
uint32_t timestampBits(const Device& dev) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(dev.physical(), &n, nullptr);
    std::vector<VkQueueFamilyProperties> families(n);
    vkGetPhysicalDeviceQueueFamilyProperties(dev.physical(), &n, families.data());
    return dev.queueFamily() < n ? families[dev.queueFamily()].timestampValidBits : 0;
}

// Cycles in the first chains under a watchdog bound, before any submission has been timed.
constexpr uint32_t kFirstChainCycles = 4;

double defaultMaxSubmitMs() {
    const char* env = std::getenv("BLUE_MAX_SUBMIT_MS");
    if (env && *env) return std::max(0.0, std::atof(env));
    return 50.0;
}

}  // namespace

uint32_t GpuMachine::Impl::profileSlot(const std::string& name) {
    for (uint32_t i = 0; i < profile.size(); ++i) {
        if (profile[i].name == name) return i;
    }
    profile.push_back({name, 0, 0});
    return uint32_t(profile.size() - 1);
}

Status GpuMachine::Impl::createChains() {
    VkDevice d = dev.device();
    if (opt.max_submit_ms < 0) opt.max_submit_ms = defaultMaxSubmitMs();
    // Under a bound, the first chains go out before any has been timed: start short and let
    // timeChain double the length while submissions stay well under the bound.
    cycles_now =
        opt.max_submit_ms > 0 ? std::min(opt.chain_cycles, kFirstChainCycles) : opt.chain_cycles;
    for (const DispatchDesc& desc : dispatches) {
        if (desc.custom >= 0) {
            op_pipelines.push_back(custom_pipelines[size_t(desc.custom)]);
            continue;
        }
        Result<VkPipeline> p = pipelines.get(desc.pipeline);
        if (!p) return p.status();
        op_pipelines.push_back(p.value());
    }
    Result<VkPipeline> seq = pipelines.get("sequencer");
    if (!seq) return seq.status();
    seq_pipeline = seq.value();
    Result<VkPipeline> plan = pipelines.get("plan");
    if (!plan) return plan.status();
    plan_pipeline = plan.value();

    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = dev.queueFamily();
    pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;  // chains are re-recorded
    BLUE_VK_TRY_ON(dev, vkCreateCommandPool(d, &pi, nullptr, &cmd_pool));
    const uint32_t n = opt.chains;
    chains.resize(n);
    chain_len.assign(n, 0);
    chain_dispatches.assign(n, 0);
    queries_used.assign(n, 0);
    if (const uint32_t bits = timestampBits(dev); bits > 0) {
        timestamp_ms = double(dev.props().limits.timestampPeriod) * 1e-6;
        timestamp_mask = bits >= 64 ? ~0ull : (1ull << bits) - 1;
        VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
        qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
        qi.queryCount = 2 * n;
        BLUE_VK_TRY_ON(dev, vkCreateQueryPool(d, &qi, nullptr, &timing));
        if (opt.profile) {
            queries_per_chain = 1 + opt.chain_cycles * uint32_t(2 + dispatches.size() + streams.groups.size());
            query_kernel.assign(queries_per_chain, 0);
            qi.queryCount = queries_per_chain * n;
            BLUE_VK_TRY_ON(dev, vkCreateQueryPool(d, &qi, nullptr, &queries));
        }
    } else if (opt.profile) {
        return Status::error("--profile needs GPU timestamps, which this device's queue lacks");
    }
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = cmd_pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = n;
    BLUE_VK_TRY_ON(dev, vkAllocateCommandBuffers(d, &ai, chains.data()));
    for (uint32_t c = 0; c < n; ++c) {
        BLUE_TRY(recordChain(c));
        VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        VkFence f;
        BLUE_VK_TRY_ON(dev, vkCreateFence(d, &fi, nullptr, &f));
        fences.push_back(f);
    }
    return Status::ok();
}

Status GpuMachine::Impl::recordChain(uint32_t c) {
    const uint32_t cycles = cycles_now;
    const VkDeviceSize indirect = VkDeviceSize(layout.at(BLUE_O_INDIRECT)) * 4;
    const VkDeviceSize seq_args = indirect + dispatches.size() * 12;
    const VkBufferCopy stage_in{VkDeviceSize(c) * BLUE_IO_STAGE_WORDS * 4, BLUE_C_IN_PUBLISHED * 4,
                                3 * 4};
    const VkBufferCopy snapshot{BLUE_C_CYCLE * 4,
                                VkDeviceSize(BLUE_IO_SNAP_BASE + c * BLUE_IO_SNAP_WORDS) * 4,
                                BLUE_SNAP_COUNTERS * 4};
    const VkBufferCopy snapshot2{BLUE_C_MOE_TEXELS_LO * 4,
                                 VkDeviceSize(BLUE_IO_SNAP2_BASE + c * BLUE_IO_SNAP2_WORDS) * 4,
                                 BLUE_SNAP2_COUNTERS * 4};
    const uint32_t qbase = c * queries_per_chain;
    uint32_t q = 0;
    auto stamp = [&](VkCommandBuffer cb, const std::string& kernel) {
        if (!queries || !cb) return;
        query_kernel[q] = profileSlot(kernel);
        vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, queries, qbase + q);
        ++q;
    };
    // Streaming: each group's copies into its slot, and the group whose copy goes before each
    // dispatch (group g + 1's before group g's first dispatch; group 0's at the cycle's start).
    std::vector<std::vector<std::pair<VkBuffer, VkBufferCopy>>> group_copies;
    std::vector<int32_t> copy_before(dispatches.size(), -1);
    for (size_t g = 0; g < streams.groups.size(); ++g) {
        std::vector<std::pair<VkBuffer, VkBufferCopy>> regions;
        for (const StreamCopy& sc : streams.groups[g].copies) {
            regions.push_back({page_buffers[sc.src_page].buffer, VkBufferCopy{sc.src_offset, sc.dst_offset, sc.bytes}});
        }
        group_copies.push_back(std::move(regions));
        if (g + 1 < streams.groups.size()) copy_before[streams.groups[g].first_dispatch] = int32_t(g + 1);
    }
    auto streamGroup = [&](ChainWriter& w, size_t g) {
        const uint32_t slot = streams.groups[g].slot;
        w.copies(kStreamCopy[slot], group_copies[g], slot_buffers[slot].buffer);
        stamp(w.cb, "stream copy");
    };
    // The chain's body, the same for the dry run and the recording.
    auto body = [&](ChainWriter& w) {
        w.copy(kStageIn, io.buffer, control.buffer, stage_in);
        if (w.cb) {
            vkCmdBindDescriptorSets(w.cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipelines.layout(), 0, 1,
                                    &set, 0, nullptr);
            if (timing)
                vkCmdWriteTimestamp(w.cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, timing, 2 * c);
        }
        stamp(w.cb, "start");
        uint64_t n = 0;
        for (uint32_t k = 0; k < cycles; ++k) {
            w.dispatchIndirect(seq_pipeline, control.buffer, seq_args);
            stamp(w.cb, "sequencer");
            w.dispatch(plan_pipeline);
            stamp(w.cb, "plan");
            n += 2;
            if (!streams.groups.empty()) streamGroup(w, 0);
            VkDescriptorSet bound_set = VK_NULL_HANDLE;
            // With conditional rendering, a block no instance asked for this cycle is skipped as a
            // whole: its instance count (written by the plan) gates its dispatches. Not while
            // weights stream: the copies into the slots sit inside those scopes, and on an NVIDIA
            // H200 (driver 580.159.04) streamed runs then gave wrong tokens from the first step,
            // right ones with BLUE_CONDITIONAL=0 (copies are not among the commands conditional
            // rendering may skip, but the scopes are not worth the risk for this mode).
            const bool gate = dev.info().conditional_rendering && streams.groups.empty();
            uint32_t open_block = UINT32_MAX;
            for (size_t d = 0; d < dispatches.size(); ++d) {
                if (gate && dispatches[d].block != open_block) {
                    if (open_block != UINT32_MAX) w.endCondition();
                    open_block = dispatches[d].block;
                    w.beginCondition(control.buffer, VkDeviceSize(layout.at(BLUE_O_BLOCKS) +
                                                                  open_block * BLUE_BLOCK_WORDS + BLUE_B_INSTS) * 4);
                }
                if (copy_before[d] >= 0) streamGroup(w, size_t(copy_before[d]));
                if (dispatches[d].custom >= 0) {
                    // A custom kernel has a pipeline layout of its own: bind its set and push its
                    // words, then give set 0 back to the built-in kernels (set 1 is rebound too,
                    // as the layouts are not compatible).
                    if (w.cb) {
                        vkCmdBindDescriptorSets(w.cb, VK_PIPELINE_BIND_POINT_COMPUTE, custom_layout, 0, 1,
                                                &custom_sets[d], 0, nullptr);
                        vkCmdPushConstants(w.cb, custom_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                           BLUE_KERNEL_PUSH_WORDS * 4, custom_push[d].data());
                    }
                    w.dispatchIndirect(op_pipelines[d], control.buffer, indirect + d * 12);
                    if (w.cb) {
                        vkCmdBindDescriptorSets(w.cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipelines.layout(), 0,
                                                1, &set, 0, nullptr);
                    }
                    bound_set = VK_NULL_HANDLE;
                    stamp(w.cb, dispatches[d].pipeline);
                    ++n;
                    continue;
                }
                if (w.cb && operand_sets[d] != bound_set) {
                    vkCmdBindDescriptorSets(w.cb, VK_PIPELINE_BIND_POINT_COMPUTE,
                                            pipelines.layout(), BLUE_SET_OPERANDS, 1,
                                            &operand_sets[d], 0, nullptr);
                    bound_set = operand_sets[d];
                }
                if (w.cb) {
                    vkCmdPushConstants(w.cb, pipelines.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                       BLUE_PUSH_WORDS * 4, dispatches[d].push.data());
                }
                w.dispatchIndirect(op_pipelines[d], control.buffer, indirect + d * 12, dispatches[d].stream_slot);
                stamp(w.cb, dispatches[d].pipeline);
                ++n;
            }
            if (open_block != UINT32_MAX) w.endCondition();
        }
        w.copy(kSnapshotOut, control.buffer, io.buffer, snapshot);
        w.copy(kSnapshotOut, control.buffer, io.buffer, snapshot2);
        if (opt.heap_watch >= 0) {
            const VkBufferCopy watch{(VkDeviceSize(layout.at(BLUE_O_HEAP)) + VkDeviceSize(opt.heap_watch)) * 4,
                                     VkDeviceSize(BLUE_IO_SNAP3_BASE + c * BLUE_IO_SNAP3_WORDS) * 4,
                                     BLUE_IO_SNAP3_WORDS * 4};
            w.copy(kSnapshotOut, control.buffer, io.buffer, watch);
        }
        w.sync.use(w.cb, kHostReads);
        if (w.cb && timing) {
            vkCmdWriteTimestamp(w.cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, timing, 2 * c + 1);
        }
        return n;
    };
    // Any chain may follow any other: a dry run gives the state a chain ends in, and the
    // recording starts from it, so its first barriers cover what the previous chain left.
    SyncTracker sync(kChainResources);
    ChainWriter dry{VK_NULL_HANDLE, sync, pipelines.layout()};
    body(dry);

    VkCommandBuffer cb = chains[c];
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    BLUE_VK_TRY_ON(dev, vkBeginCommandBuffer(cb, &bi));
    if (timing) vkCmdResetQueryPool(cb, timing, 2 * c, 2);
    if (queries) vkCmdResetQueryPool(cb, queries, qbase, queries_per_chain);
    ChainWriter rec{cb, sync, pipelines.layout()};
    chain_dispatches[c] = body(rec);
    BLUE_VK_TRY_ON(dev, vkEndCommandBuffer(cb));
    chain_len[c] = cycles;
    queries_used[c] = q;
    return Status::ok();
}

Status GpuMachine::Impl::collectProfile(uint32_t chain) {
    if (!queries || queries_used[chain] == 0) return Status::ok();
    const uint32_t used = queries_used[chain];
    std::vector<uint64_t> ts(used);
    BLUE_VK_TRY_ON(dev, vkGetQueryPoolResults(dev.device(), queries, chain * queries_per_chain,
                                              used, ts.size() * 8, ts.data(), 8,
                                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
    for (uint32_t q = 1; q < used; ++q) {
        KernelTime& k = profile[query_kernel[q]];
        k.ms += double((ts[q] - ts[q - 1]) & timestamp_mask) * timestamp_ms;
        ++k.dispatches;
    }
    return Status::ok();
}

Status GpuMachine::Impl::timeChain(uint32_t c, GpuStats* stats) {
    if (!timing) return Status::ok();
    uint64_t ts[2];
    BLUE_VK_TRY_ON(dev, vkGetQueryPoolResults(dev.device(), timing, 2 * c, 2, sizeof ts, ts, 8,
                                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
    const double ms = double((ts[1] - ts[0]) & timestamp_mask) * timestamp_ms;
    stats->submit_ms_max = std::max(stats->submit_ms_max, ms);
    stats->submit_ms_total += ms;
    ++stats->submits_timed;
    const double bound = opt.max_submit_ms;
    if (bound <= 0 || chain_len[c] != cycles_now) return Status::ok();
    // Keep a margin below the bound: cycles differ (a prefill costs more than a decode step).
    const double per_cycle = ms / chain_len[c];
    if (ms > bound && cycles_now > 1) {
        cycles_now = std::clamp(uint32_t(0.7 * bound / per_cycle), 1u, cycles_now - 1);
    } else if (ms < 0.3 * bound && cycles_now < opt.chain_cycles) {
        uint32_t fit = per_cycle > 0 ? uint32_t(0.7 * bound / per_cycle) : opt.chain_cycles;
        cycles_now = std::clamp(std::min(cycles_now * 2, fit), cycles_now, opt.chain_cycles);
    }
    stats->chain_cycles_min = std::min(stats->chain_cycles_min, cycles_now);
    stats->chain_cycles_now = cycles_now;
    return Status::ok();
}

}  // namespace blue
