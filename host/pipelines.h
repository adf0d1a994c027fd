// Compute pipelines for the embedded kernels: one descriptor-set layout and one pipeline layout
// shared by all of them (shaders/blue_config.h's bindings and push constants), pipelines created
// on first use, and a pipeline cache kept on disk so drivers that compile at pipeline creation
// (lavapipe's LLVM JIT) pay for it once per machine.
#pragma once

#include <volk.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host/device.h"

namespace blue {

// Kernel variants chosen per device. A variant is another build of one kernel's shader (a define,
// shaders/CMakeLists.txt), embedded under its own name; Pipelines::get(kernel) returns the variant
// the device needs. Today only the sequencer has one: without subgroup ballot in compute it
// counts live instances with one atomic add per live invocation ("sequencer_noballot").
//
// The embedded kernel that runs `kernel` on this device (`kernel` itself when it has no variant).
std::string kernelVariant(const std::string& kernel, const DeviceInfo& info);
// Why kernelVariant chose what it chose, for `bluevm devices` (empty when there is no choice).
std::string kernelVariantReason(const std::string& kernel, const DeviceInfo& info);
// False for an embedded kernel that is a variant not chosen for this device (or the kernel a
// chosen variant replaces): its needs do not count against the device.
bool kernelChosen(const std::string& embedded, const DeviceInfo& info);

// The pipeline cache file: an 8-byte magic, the 64-bit FNV-1a hash of the driver's blob, then the
// blob. A torn or damaged file (another process writing, a full disk) fails the hash and is
// ignored: a driver is only required to check the blob's header, and a corrupted payload can give
// it broken kernels. Writes go to a temporary file of this process and are renamed over the
// cache, so concurrent processes never read each other's half-written files.
std::vector<char> encodePipelineCache(const std::vector<char>& blob);
// The blob of a cache file, or nothing when it is not one whole such file.
std::optional<std::vector<char>> decodePipelineCache(const std::vector<char>& file);
// Writes the encoded blob to `path` through a temporary file; false when it could not.
bool writePipelineCacheFile(const std::string& path, const std::vector<char>& blob);
// The blob of the cache file at `path`, or an empty one when it is missing or damaged.
std::vector<char> readPipelineCacheFile(const std::string& path);

// A kernel name may end in "@W": the kernel built with a variable workgroup width (its
// `local_size_x_id` is BLUE_SPEC_WG) run with W lanes; the plan narrows kernels that way where a
// CPU driver pays for every lane a workgroup has, busy or not (host/machine_plan.cpp). Then, or
// instead, in "#Q": the attention kernels (shaders/attn.comp) specialized for heads of Q quads of
// elements (BLUE_SPEC_HEAD_QUADS), so that their per-lane arrays have constant indices.
struct KernelWidth {
    std::string kernel;       // the name without "@W" and "#Q"
    uint32_t width = 0;       // 0: the width the kernel was built with
    uint32_t head_quads = 0;  // 0: not specialized (the kernel reads the head size)
};
// The kernel, width and head quads a name asks for; nothing when what follows '@' or '#' is not
// a count.
std::optional<KernelWidth> splitKernelWidth(const std::string& name);

class Pipelines {
public:
    ~Pipelines();
    Pipelines(const Pipelines&) = delete;
    Pipelines& operator=(const Pipelines&) = delete;

    static Result<std::unique_ptr<Pipelines>> create(Device& dev);

    // True when an embedded kernel of that name exists ("@W" allowed, splitKernelWidth).
    static bool exists(const std::string& name);
    // The pipeline of an embedded kernel (its variant for this device, kernelVariant), created
    // on first use.
    Result<VkPipeline> get(const std::string& name);

    VkDescriptorSetLayout setLayout() const { return set_layout_; }          // set 0
    VkDescriptorSetLayout operandLayout() const { return operand_layout_; }  // set 1
    VkPipelineLayout layout() const { return layout_; }
    // Writes the pipeline cache to disk (also done by the destructor).
    void saveCache();

private:
    explicit Pipelines(Device& dev) : dev_(dev) {}
    std::string cachePath() const;

    Device& dev_;
    VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
    VkDescriptorSetLayout operand_layout_ = VK_NULL_HANDLE;
    VkPipelineLayout layout_ = VK_NULL_HANDLE;
    VkPipelineCache cache_ = VK_NULL_HANDLE;
    std::map<std::string, VkPipeline> pipelines_;
    bool cache_dirty_ = false;
};

}  // namespace blue
