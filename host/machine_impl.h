// GpuMachine's private state, shared by its implementation files: machine.cpp (loading, the run
// loop) and machine_chain.cpp (chain recording, its barriers, and the chain length that keeps
// one submission under the watchdog bound).
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "host/machine.h"
#include "host/machine_plan.h"

namespace blue {

struct GpuMachine::Impl {
    Device& dev;
    Pipelines& pipelines;
    const Module& m;
    GpuOptions opt;
    ControlLayout layout;
    PagePlan pages;
    std::vector<DispatchDesc> dispatches;
    StreamPlan streams;                 // empty unless weights stream (GpuOptions::host_weights)
    Buffer slot_buffers[2];             // streaming: the two device-local slots

    Buffer control, io;
    std::vector<Buffer> page_buffers;
    std::vector<VkBufferView> page_views;  // rgba32ui storage texel views of the pages
    VkDescriptorPool pool = VK_NULL_HANDLE;
    VkDescriptorSet set = VK_NULL_HANDLE;
    VkDescriptorPool operand_pool = VK_NULL_HANDLE;
    std::vector<VkDescriptorSet> operand_sets;  // per dispatch: its set 1
    VkCommandPool cmd_pool = VK_NULL_HANDLE;
    std::vector<VkCommandBuffer> chains;
    std::vector<VkFence> fences;
    std::vector<VkPipeline> op_pipelines;  // per dispatch
    VkPipeline seq_pipeline = VK_NULL_HANDLE, plan_pipeline = VK_NULL_HANDLE;

    // Custom kernels (host/machine_kernel.cpp): their own set layout and pipeline layout (the
    // contract of vm/kernel_abi.h, nothing of the built-in bindings), one pipeline per kernel and
    // one descriptor set per KERNEL dispatch.
    VkDescriptorSetLayout custom_set_layout = VK_NULL_HANDLE;
    VkPipelineLayout custom_layout = VK_NULL_HANDLE;
    VkDescriptorPool custom_pool = VK_NULL_HANDLE;
    std::vector<VkPipeline> custom_pipelines;   // per module kernel (null: unused)
    std::vector<VkDescriptorSet> custom_sets;   // per dispatch (null: a built-in op)
    std::vector<std::array<uint32_t, 8>> custom_push;  // per dispatch: the contract's push words

    // Chain length: each chain is recorded with chain_len[c] cycles; `cycles_now` is the length
    // the watchdog bound currently asks for (at most opt.chain_cycles). A chain whose length
    // differs is re-recorded before its next submission (it is idle then).
    std::vector<uint32_t> chain_len;
    std::vector<uint64_t> chain_dispatches;  // dispatch commands in each chain
    uint32_t cycles_now = 0;
    VkQueryPool timing = VK_NULL_HANDLE;  // 2 timestamps per chain: start, end
    double timestamp_ms = 0;              // ms per timestamp tick
    uint64_t timestamp_mask = 0;          // valid bits of a timestamp

    VkQueryPool queries = VK_NULL_HANDLE;  // --profile: one timestamp per dispatch
    uint32_t queries_per_chain = 0;        // capacity, for opt.chain_cycles
    std::vector<uint32_t> queries_used;    // per chain, as recorded
    std::vector<uint32_t> query_kernel;    // per query slot within a chain: index into profile
    std::vector<KernelTime> profile;

    // Host side of the I/O rings.
    std::deque<std::vector<uint32_t>> pending;
    uint64_t published = 0;
    bool input_closed = false;
    uint64_t out_tail = 0;

    std::deque<uint32_t> inflight;  // submitted chains, oldest first
    uint32_t next_chain = 0;
    bool gpu_done = false;  // the last snapshot showed no live instance
    bool paused = false;    // the host stopped submitting (pump without keep_going)
    std::chrono::steady_clock::time_point started;

    Impl(Device& d, Pipelines& p, const Module& mod, const GpuOptions& o)
        : dev(d), pipelines(p), m(mod), opt(o) {}
    ~Impl();

    uint32_t* ioWords() const { return static_cast<uint32_t*>(io.mapped); }
    Status allocate();
    Status initControl();
    Status uploadWeights(const WeightSource& weights);
    Status createDescriptors();
    Status createOperandSets();
    Status createCustomKernels();  // machine_kernel.cpp
    void destroyCustomKernels();
    void publishInput(uint32_t chain);
    void drainOutput(uint32_t chain, const OutputSink& sink, bool keep, RunReport* report,
                     GpuStats* stats);
    Status readInstances(RunReport* report, GpuStats* stats);
    Status submit(GpuStats* stats);

    // machine_chain.cpp
    Status createChains();
    Status recordChain(uint32_t c);
    // After chain c completed: reads its GPU time, folds it into the stats and adapts the
    // chain length to the watchdog bound.
    Status timeChain(uint32_t c, GpuStats* stats);
    uint32_t profileSlot(const std::string& name);
    Status collectProfile(uint32_t chain);
};

}  // namespace blue
