// Compute pipelines for the embedded kernels: one descriptor-set layout and one pipeline layout
// shared by all of them (shaders/blue_config.h's bindings and push constants), pipelines created
// on first use, and a pipeline cache kept on disk so drivers that compile at pipeline creation
// (lavapipe's LLVM JIT) pay for it once per machine.
#pragma once

#include <volk.h>

#include <map>
#include <memory>
#include <string>

#include "host/device.h"

namespace blue {

class Pipelines {
public:
    ~Pipelines();
    Pipelines(const Pipelines&) = delete;
    Pipelines& operator=(const Pipelines&) = delete;

    static Result<std::unique_ptr<Pipelines>> create(Device& dev);

    // True when an embedded kernel of that name exists.
    static bool exists(const std::string& name);
    // The pipeline of an embedded kernel, created on first use.
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
