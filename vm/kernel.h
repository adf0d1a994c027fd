// Custom kernels: SPIR-V carried inside a module (section KERNELS) and run by the tensor
// instruction KERNEL. The module is untrusted input, so every kernel is checked here before any
// pipeline is made from it: SPIRV-Tools' validator (the same rules as spirv-val, Vulkan 1.2),
// then the contract of vm/kernel_abi.h read from the SPIR-V itself (entry point, execution model,
// local size, bindings and their access, push constants, capabilities, workgroup memory).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vm/status.h"

namespace blue {

struct KernelDecl {
    std::string name;
    std::vector<uint32_t> spirv;  // SPIR-V words
};

// What the checks read from a kernel that passed them.
struct KernelShape {
    uint32_t local[3] = {1, 1, 1};  // workgroup size
    uint32_t bindings = 0;          // bit b: binding b is declared
    uint32_t push_bytes = 0;        // size of the push-constant block (0: none)
    uint32_t shared_bytes = 0;      // workgroup memory
};

// Checks a kernel against spirv-val's rules and the contract. `what` names it in messages
// ("kernel 'count'"); every message is one line: "WHAT: what is wrong".
Result<KernelShape> checkKernelSpirv(std::span<const uint32_t> words, const std::string& what);

// Only the contract's reflection checks (no spirv-val), for tests and for callers that ran the
// validator already.
Result<KernelShape> reflectKernelSpirv(std::span<const uint32_t> words, const std::string& what);

// SPIRV-Tools' validator alone (target environment Vulkan 1.2).
Status validateSpirv(std::span<const uint32_t> words, const std::string& what);

}  // namespace blue
