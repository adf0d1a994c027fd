// Where the bytes of WEIGHT tensors (and initial GLOBAL data) come from: the module's DATA
// section, or external files (GGUF models) that the module names, memory-mapped.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "vm/mapped_file.h"
#include "vm/module.h"

namespace blue {

class WeightSource {
public:
    // Maps every external file and checks each tensor's byte range lies inside its file.
    // Relative paths are resolved against `module_dir`. `m` must outlive the source.
    static Result<WeightSource> open(const Module& m, const std::string& module_dir);

    // Bytes of tensor `index`; empty for tensors without data.
    std::span<const uint8_t> tensorBytes(uint32_t index) const;

private:
    const Module* module_ = nullptr;
    std::vector<MappedFile> files_;
};

// Joins a module-relative path; absolute paths are returned unchanged.
std::string resolveModulePath(const std::string& module_dir, const std::string& path);

}  // namespace blue
