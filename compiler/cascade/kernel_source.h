// Custom kernels of a cascade (`kernel NAME = "file.comp"` or "file.spv"): loading the file,
// compiling GLSL compute source to SPIR-V with glslang, and the checks every module loader runs
// again (vm/kernel.h: spirv-val and the contract of vm/kernel_abi.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "vm/status.h"

namespace blue {

// Compiles GLSL compute source (Vulkan 1.2, SPIR-V 1.5) to SPIR-V. `file` names the source in
// messages: "FILE:LINE: glslang's message" for the first error. #include is not supported.
Result<std::vector<uint32_t>> compileGlslKernel(std::string_view source, const std::string& file);

// Loads a kernel file: ".spv" is SPIR-V (little-endian words), any other name GLSL compute
// source. The result passed checkKernelSpirv(); failures name the file and what is wrong.
Result<std::vector<uint32_t>> loadKernelFile(const std::string& path);

}  // namespace blue
