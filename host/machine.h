// GpuMachine: runs a verified Blue-IR module on a Vulkan device.
//
// The host loads (control buffer, tensors in pages, weights), records `chains` command buffers
// once, each holding `chain_cycles` cycles of [sequencer -> plan -> every block's dispatches,
// each vkCmdDispatchIndirect], and then only submits: while chain A runs, chain B is already
// queued; when A completes the host drains the output records A produced, refills A's staging
// quarter (new input messages, output-ring acknowledgement) and resubmits A. The host never reads
// a register, a token or a flag to decide what the GPU does; it only learns when every instance
// has stopped, to stop submitting. --stats counts all of this.
#pragma once

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "host/buffer.h"
#include "host/device.h"
#include "host/pipelines.h"
#include "shaders/blue_config.h"
#include "vm/interp.h"
#include "vm/module.h"
#include "vm/weights.h"

namespace blue {

struct GpuOptions {
    uint32_t instances = 1;
    // The longest history a SAMPLE's penalties can walk (an LLM's context; 0: unknown). On a CPU
    // driver it lets sampling run on fewer lanes (sampleWidth) without shortening any window.
    uint32_t sample_history = 0;
    uint64_t max_cycles = 1000000;
    uint32_t chain_cycles = 64;       // K: cycles recorded in each chain
    uint32_t chains = 2;              // chains leapfrogging (1..BLUE_MAX_CHAINS)
    uint32_t out_records = 1u << 16;  // output ring capacity
    bool profile = false;             // time every dispatch with GPU timestamps
    // Watchdog bound: drivers reset a GPU whose submission runs too long (Windows TDR: 2 s; some
    // Linux drivers: less), so the chain length adapts, down to one cycle, to keep each
    // submission's GPU time (measured with timestamps) under this many ms. 0: off, chains keep
    // chain_cycles. Negative: the default, BLUE_MAX_SUBMIT_MS or 50.
    double max_submit_ms = -1;
    // BLUE_IO_SNAP3_WORDS heap words from this one (-1: none) are copied to the host at the end of
    // every chain, into GpuStats::heap_watch: counters a program keeps there (a paged KV pool's,
    // vm/kv_pages_abi.h), read while it runs without a transfer of their own.
    int64_t heap_watch = -1;
    // Called while create() uploads the weights: bytes done of the total (progress bars).
    std::function<void(uint64_t done, uint64_t total)> on_load;
    // Device-local memory the machine may use (--vram-budget; 0: all it needs): the control
    // buffer and the activations always, weights while they fit; the other weights stay in host
    // memory that the kernels read directly (planPages in host/machine_plan.h).
    uint64_t vram_budget = 0;
    // How kernels reach the weights beyond the budget: READ them in host memory in place, or
    // STREAM them, a group of matrices at a time, into two device-local slots ahead of the
    // dispatches that read them (copies overlap the previous group's compute). AUTO: STREAM
    // where the device has host memory apart from its own (a discrete GPU), else READ.
    enum class HostWeights { AUTO, READ, STREAM };
    HostWeights host_weights = HostWeights::AUTO;
    // MoE under a budget the weights do not fit: experts stay in host memory and the budget the
    // other weights leave caches them, decided on the GPU (ExpertCache in host/machine_plan.h).
    // Off: experts are weights like any other (read in place or streamed whole).
    bool expert_cache = true;
    // The MATMUL kernels' shapes. ROWS, lavapipe's: a single item's and the 4-item tile's lanes
    // own whole rows (its SIMD lanes are the rows), and 16 items or more run the register-tiled
    // `_g` where the type has one. SPLIT, a GPU's: 1-15 items give each group of 8 rows a
    // workgroup whose lanes split K (many workgroups, contiguous reads), 16 or more run the
    // shared-memory tiled GEMM `_t`. AUTO: the BLUE_DECODE_KERNEL environment variable (rows or
    // split) if set, else SPLIT on GPUs and ROWS on CPU drivers.
    enum class DecodeKernel { AUTO, ROWS, SPLIT };
    DecodeKernel decode_kernel = DecodeKernel::AUTO;
    // The ATTN/ATTNX/ATTNP kernel: LANES gives each head one lane walking the positions, SPLIT gives
    // each head a workgroup whose lanes split the positions. On an H100 SPLIT measured 1.84x
    // LANES' generation and 1.57x its prompt rate (tinyllama shape, README); on lavapipe it is
    // 2.3x slower. AUTO: the BLUE_ATTN_KERNEL environment variable (lanes or split) if set, else
    // SPLIT on GPUs and LANES on CPU drivers.
    enum class AttnKernel { AUTO, LANES, SPLIT };
    AttnKernel attn_kernel = AttnKernel::AUTO;
    // The int8 GEMM (`_tq`, shaders/matmul_tiled.comp): batches that reach the GEMM, over block-type
    // matrices, take x quantized to int8 per 32 elements and packed 4 x 8-bit integer dot products
    // (VK_KHR_shader_integer_dot_product) instead of the float GEMM. ON needs the device feature
    // (refused at load without it); AUTO: the BLUE_MATMUL_INT8 environment variable (0 or 1) if
    // set, else on where the device says the packed signed dot product is accelerated.
    enum class Int8Matmul { AUTO, OFF, ON };
    Int8Matmul int8_matmul = Int8Matmul::AUTO;
    // Keep clock(): one point per drained chain (one-shot runs; a server would grow it forever).
    bool record_clock = false;
};

// A point of a run's clock: `cycles` VM cycles were done `ms` after the first submit (the host
// saw the chain that ran them complete then; with chains in flight this is at or after the
// GPU finished them). Stage times are interpolated between such points (cascade --stats).
struct CycleTime {
    uint64_t cycles = 0;
    double ms = 0;
};

// Time spent per kernel when GpuOptions::profile is on.
struct KernelTime {
    std::string name;
    uint64_t dispatches = 0;  // recorded dispatches timed (empty ones included)
    double ms = 0;
};

struct GpuStats {
    uint64_t submits = 0;              // vkQueueSubmit calls for chains
    uint64_t cycles = 0;               // cycles in which an instance was live
    uint64_t cycles_submitted = 0;     // chain_cycles x submits
    uint64_t dispatches_recorded = 0;  // dispatch commands in all recorded chains
    uint64_t host_waits = 0;           // fence waits
    uint64_t round_trips = 0;          // submits that waited for a GPU result with the queue empty
    uint64_t queue_drains = 0;         // submits that found the GPU already idle
    uint64_t resumes = 0;              // submits after the host paused (pump without keep_going:
                                       // a server with no request); not round trips
    uint64_t steps = 0;                // control instructions executed
    uint64_t block_runs = 0;           // (cycle, block) pairs with work
    uint64_t output_records = 0;
    uint64_t expert_bytes = 0;         // MoE expert weights the chosen experts' matmuls read
    uint64_t vram_bytes = 0;           // device-local memory: the control buffer and tier-0 pages
    uint64_t host_weight_bytes = 0;    // weights in host memory (beyond GpuOptions::vram_budget)
    uint64_t stream_bytes_per_cycle = 0;  // streaming: bytes copied into the slots each cycle
    bool streaming = false;
    // Expert caches (MoE under a budget): slots per layer and their bytes; experts the runs
    // found cached, copied in, and read in place (no slot free); bytes copied in.
    uint32_t expert_cache_slots = 0;
    uint64_t expert_cache_bytes = 0;
    uint64_t expert_hits = 0, expert_misses = 0, expert_inplace = 0, expert_paged_bytes = 0;
    // GpuOptions::heap_watch's words as the last drained chain left them (zeros when none).
    std::array<uint32_t, BLUE_IO_SNAP3_WORDS> heap_watch{};
    uint32_t instances = 0;
    uint32_t chain_cycles = 0;         // cycles per chain asked for
    uint32_t chain_cycles_now = 0;     // the length the watchdog bound allows now
    uint32_t chain_cycles_min = 0;     // the shortest length used
    uint64_t chain_rerecords = 0;      // chains re-recorded at another length
    uint64_t submits_timed = 0;        // submissions timed with GPU timestamps
    double submit_ms_max = 0;          // longest submission's GPU time
    double submit_ms_total = 0;        // sum over timed submissions
    double wall_ms = 0;  // from first submit to the last result
    std::vector<KernelTime> profile;  // by kernel, when profiling

    // One JSON object on one line.
    std::string json() const;
};

// A table of GpuStats::profile, slowest kernel first.
std::string formatProfile(const GpuStats& stats);

using OutputSink = std::function<void(std::span<const OutputRecord>)>;

// The kernel shapes a machine made with `options` on this device uses where there is a choice
// (GpuOptions::decode_kernel and attn_kernel, with their environment variables), in words, for
// `bluevm devices` and `bluevm bench`; an error for a bad BLUE_DECODE_KERNEL/BLUE_ATTN_KERNEL.
Result<std::string> describeKernelShapes(const GpuOptions& options, const DeviceInfo& info);

class GpuMachine {
public:
    ~GpuMachine();
    GpuMachine(const GpuMachine&) = delete;
    GpuMachine& operator=(const GpuMachine&) = delete;

    // Plans memory, allocates buffers, uploads code and weights, records the chains. `m` and
    // `weights` must outlive the machine. Fails with a clear message when the module needs more
    // than the device allows (a tensor larger than a binding, too many pages, out of memory).
    static Result<std::unique_ptr<GpuMachine>> create(Device& dev, Pipelines& pipelines,
                                                      const Module& m, const WeightSource& weights,
                                                      const GpuOptions& options);

    // Queues an input message (at most layout.in_slot_words - 1 words).
    Status pushInput(std::vector<uint32_t> message);
    void closeInput();

    // Runs until no instance is live. Output records go to `sink` as each chain completes (and
    // into the report when `keep_output`). The report's status carries the watchdog error.
    Result<RunReport> run(const OutputSink& sink = {}, bool keep_output = true);

    const GpuStats& stats() const { return stats_; }
    // Continuous use (serving). pump() submits chains while `keep_going` and the GPU still has
    // live instances (up to `chains` in flight), then waits for the oldest chain, drains its
    // output records to `sink` (and into `report` when given), and returns true; it returns
    // false when no chain was in flight. The host decides keep_going from its own bookkeeping
    // (requests it submitted that have not ended), never from GPU state.
    Result<bool> pump(const OutputSink& sink, bool keep_going, RunReport* report = nullptr);
    bool gpuDone() const;   // the GPU reported no live instance (every instance halted)
    bool inFlight() const;  // a chain is submitted and not yet drained
    size_t pendingInput() const;  // messages queued but not yet in the input ring
    // Sets host flag word `index` (one per instance), read by the INFLAG instruction.
    void setFlag(uint32_t index, uint32_t value);
    // With GpuOptions::record_clock: (cycles done, ms) after each drained chain, in order.
    const std::vector<CycleTime>& clock() const { return clock_; }

    // Reads a tensor back in the reference machine's packing: its slices (rows, instances or
    // the whole tensor) back to back, without the GPU's texel padding. Weights held in the GPU
    // layout are refused (read them from their source).
    Status readTensor(uint32_t index, std::vector<uint8_t>* out);

    // One instance's memory, between runs only (before the first submit, or after run()
    // returned): `count` words of instance `inst`'s local memory from word `word`, and bytes of
    // its slice of an INSTANCE tensor from `offset` (the reference machine's packing: a slice's
    // padding is at its end), or of a GLOBAL tensor (one copy: instance 0; a paged KV pool).
    // Saving and restoring a conversation (host/memory/kv_snapshot.h) is the host moving I/O,
    // never a decision about what runs. Fail on a range outside the instance's memory, on a
    // tensor that is neither INSTANCE nor GLOBAL, or while a chain is in flight.
    Status readLocal(uint32_t inst, uint32_t word, std::span<uint32_t> out);
    Status writeLocal(uint32_t inst, uint32_t word, std::span<const uint32_t> words);
    Status readInstanceTensor(uint32_t tensor, uint32_t inst, uint64_t offset, std::span<uint8_t> out);
    Status writeInstanceTensor(uint32_t tensor, uint32_t inst, uint64_t offset,
                               std::span<const uint8_t> bytes);

private:
    struct Impl;
    explicit GpuMachine(std::unique_ptr<Impl> impl);
    // Byte offset in the control buffer of local words [word, +n) of instance `inst`, checked.
    Result<uint64_t> localBytes(uint32_t inst, uint32_t word, size_t n, const char* verb) const;
    std::unique_ptr<Impl> impl_;
    GpuStats stats_;
    std::vector<CycleTime> clock_;
};

}  // namespace blue
