// Barriers derived from one description of what each command reads and writes.
//
// Every command recorded into a chain first declares its uses: which resource (a buffer or a
// group of buffers the recorder numbers), at which pipeline stage, with which access. The
// tracker keeps, per resource, the last write and the reads since, and records the one
// vkCmdPipelineBarrier (a global memory barrier) the new command needs:
//   read after write   the write's stage and access -> the read's (unless already made visible)
//   write after write  the same, with the new write's access as the destination
//   write after read   an execution dependency from the reads' stages to the write's stage
// A command that conflicts with nothing gets no barrier. Since a global barrier covers every
// resource, the tracker also marks what each barrier it records made visible elsewhere.
//
// Chains are replayed: any chain may follow any other in the queue, and a barrier at the start
// of a command buffer orders it after everything submitted before it. Record a chain once with
// a null command buffer (a dry run: the state advances, nothing is recorded), then record it
// for real starting from the state the dry run ended in: the barriers at the chain's start then
// cover what the previous chain left, exactly.
//
// Host accesses (HOST stage) are made visible to by barriers like any other, but never order
// later GPU work: fences and the I/O ring protocol do that.
#pragma once

#include <volk.h>

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace blue {

struct SyncUse {
    uint32_t resource = 0;
    VkPipelineStageFlags stage = 0;
    VkAccessFlags access = 0;  // reads and/or writes
};

struct SyncBarrier {
    VkPipelineStageFlags src_stage = 0, dst_stage = 0;
    VkAccessFlags src_access = 0, dst_access = 0;
    bool empty() const { return src_stage == 0; }
};

class SyncTracker {
  public:
    explicit SyncTracker(uint32_t resources) : state_(resources) {}

    // Declares the uses of the command about to be recorded into `cb` and records the barrier
    // they need first (none when nothing conflicts). `cb` may be VK_NULL_HANDLE (dry run).
    // Returns the barrier (empty when none).
    SyncBarrier use(VkCommandBuffer cb, std::span<const SyncUse> uses);
    SyncBarrier use(VkCommandBuffer cb, std::initializer_list<SyncUse> uses) {
        return use(cb, std::span<const SyncUse>(uses.begin(), uses.size()));
    }

    uint64_t barriers() const { return barriers_; }  // barriers recorded (or planned, dry)

  private:
    struct Visible {
        VkPipelineStageFlags stage;
        VkAccessFlags access;
    };
    struct Resource {
        VkPipelineStageFlags write_stage = 0;  // last write (0: none since the start)
        VkAccessFlags write_access = 0;
        std::vector<Visible> visible;                   // what the last write was made visible to
        VkPipelineStageFlags read_stages = 0;           // reads since the last write
        VkPipelineStageFlags reads_ordered_before = 0;  // stages a barrier put after those reads
    };
    bool isVisible(const Resource& r, VkPipelineStageFlags stage, VkAccessFlags access) const;
    void applyBarrier(const SyncBarrier& b);
    void applyUse(const SyncUse& u);

    std::vector<Resource> state_;
    uint64_t barriers_ = 0;
};

// "COMPUTE_SHADER|TRANSFER" style names, for messages and tests.
std::string syncStageNames(VkPipelineStageFlags stages);
std::string syncAccessNames(VkAccessFlags access);

}  // namespace blue
