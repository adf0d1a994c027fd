// Barrier derivation from declared uses (see sync.h).
#include "host/sync.h"

#include <cassert>

namespace blue {

namespace {

constexpr VkAccessFlags kWriteAccess = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
                                       VK_ACCESS_HOST_WRITE_BIT | VK_ACCESS_MEMORY_WRITE_BIT;

bool subset(uint32_t a, uint32_t b) {
    return (a & ~b) == 0;
}

}  // namespace

bool SyncTracker::isVisible(const Resource& r, VkPipelineStageFlags stage,
                            VkAccessFlags access) const {
    for (const Visible& v : r.visible) {
        if (subset(stage, v.stage) && subset(access, v.access)) return true;
    }
    return false;
}

SyncBarrier SyncTracker::use(VkCommandBuffer cb, std::span<const SyncUse> uses) {
    SyncBarrier b;
    for (const SyncUse& u : uses) {
        assert(u.resource < state_.size());
        assert(u.stage != VK_PIPELINE_STAGE_HOST_BIT || !(u.access & kWriteAccess));
        const Resource& r = state_[u.resource];
        if (r.write_stage && !isVisible(r, u.stage, u.access)) {  // after a write
            b.src_stage |= r.write_stage;
            b.src_access |= r.write_access;
            b.dst_stage |= u.stage;
            b.dst_access |= u.access;
        }
        if ((u.access & kWriteAccess) && r.read_stages &&
            !subset(u.stage, r.reads_ordered_before)) {
            b.src_stage |= r.read_stages;  // write after read: execution order only
            b.dst_stage |= u.stage;
        }
    }
    if (!b.empty()) {
        if (cb) {
            VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
            mb.srcAccessMask = b.src_access;
            mb.dstAccessMask = b.dst_access;
            vkCmdPipelineBarrier(cb, b.src_stage, b.dst_stage, 0, 1, &mb, 0, nullptr, 0, nullptr);
        }
        ++barriers_;
        applyBarrier(b);
    }
    for (const SyncUse& u : uses) applyUse(u);
    return b;
}

// A global barrier: every resource whose last write it covers becomes visible to its
// destination; reads it covers are ordered before its destination stages.
void SyncTracker::applyBarrier(const SyncBarrier& b) {
    for (Resource& r : state_) {
        if (r.write_stage && subset(r.write_stage, b.src_stage) &&
            subset(r.write_access, b.src_access)) {
            r.visible.push_back({b.dst_stage, b.dst_access});
        }
        if (r.read_stages && subset(r.read_stages, b.src_stage)) {
            r.reads_ordered_before |= b.dst_stage;
        }
    }
}

void SyncTracker::applyUse(const SyncUse& u) {
    if (u.stage == VK_PIPELINE_STAGE_HOST_BIT) return;  // the host is ordered by fences
    Resource& r = state_[u.resource];
    if (VkAccessFlags writes = u.access & kWriteAccess) {
        r = Resource{};
        r.write_stage = u.stage;
        r.write_access = writes;
        return;
    }
    // A new read is ordered before nothing yet: forget what earlier reads were ordered before.
    r.read_stages |= u.stage;
    r.reads_ordered_before = 0;
}

namespace {

template <typename Flag, size_t N>
std::string names(uint32_t flags, const std::pair<Flag, const char*> (&table)[N]) {
    std::string out;
    for (const auto& [bit, name] : table) {
        if (!(flags & bit)) continue;
        out += (out.empty() ? "" : "|") + std::string(name);
        flags &= ~uint32_t(bit);
    }
    if (flags) out += (out.empty() ? "" : "|") + std::string("0x") + std::to_string(flags);
    return out.empty() ? "NONE" : out;
}

}  // namespace

std::string syncStageNames(VkPipelineStageFlags stages) {
    static const std::pair<VkPipelineStageFlagBits, const char*> table[] = {
        {VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, "DRAW_INDIRECT"},
        {VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, "COMPUTE_SHADER"},
        {VK_PIPELINE_STAGE_TRANSFER_BIT, "TRANSFER"},
        {VK_PIPELINE_STAGE_HOST_BIT, "HOST"},
    };
    return names(stages, table);
}

std::string syncAccessNames(VkAccessFlags access) {
    static const std::pair<VkAccessFlagBits, const char*> table[] = {
        {VK_ACCESS_INDIRECT_COMMAND_READ_BIT, "INDIRECT_COMMAND_READ"},
        {VK_ACCESS_SHADER_READ_BIT, "SHADER_READ"},
        {VK_ACCESS_SHADER_WRITE_BIT, "SHADER_WRITE"},
        {VK_ACCESS_TRANSFER_READ_BIT, "TRANSFER_READ"},
        {VK_ACCESS_TRANSFER_WRITE_BIT, "TRANSFER_WRITE"},
        {VK_ACCESS_HOST_READ_BIT, "HOST_READ"},
    };
    return names(access, table);
}

}  // namespace blue
