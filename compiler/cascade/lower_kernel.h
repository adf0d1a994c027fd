// The custom-kernel part of cascade lowering (`kernel` declarations, `score` statements and
// `KERNEL.value` in conditions), kept beside lower.cpp as free functions over the module so the
// lowering of stages does not grow.
#pragma once

#include <functional>
#include <map>
#include <vector>

#include "compiler/cascade/ast.h"
#include "vm/module.h"
#include "vm/status.h"

namespace blue::cascade {

struct LoweredKernel {
    uint32_t slot_tensor = 0;    // INSTANCE I32 [1 + capacity]: the slot copied in by `score`
    uint32_t result_tensor = 0;  // INSTANCE F32 [BLUE_KERNEL_RESULT_WORDS]
    uint32_t slot_words = 0;
    uint32_t out_tensor = 0xFFFFFFFFu;  // INSTANCE I32 [1 + capacity]: the slot `filter` writes
};

struct LoweredKernels {
    std::vector<LoweredKernel> kernels;      // per Program::kernels
    std::map<const Stmt*, uint32_t> blocks;  // per `score` statement: its block
};

// Slot index by name (0: input), -1 when there is none; the lowering's own lookup.
using SlotLookup = std::function<int(const std::string&)>;
// Tokens of literal text in the cascade's vocabulary (for `param "text"`).
using Tokenize = std::function<std::vector<uint32_t>(const std::string&)>;

// Checks every `score` statement (its slot exists) and every condition on a kernel (`.value`,
// `.value1`..`.value15`, after a `score` of that kernel in the source). Messages are FILE:LINE:COL.
Status checkKernelUses(const Program& p, const SlotLookup& slot_index);
// Checks one condition subject that names a kernel (`k` indexes Program::kernels); `at` is where
// the condition is written.
Status checkKernelCond(const Program& p, uint32_t k, const Cond& c, Loc at);
// Word of the kernel's results a condition metric reads (value: 0, valueN: N).
uint32_t kernelMetricWord(const std::string& metric);

// Loads (compiling GLSL), checks and embeds every declared kernel, adds its tensors and one block
// per `score` statement. `slot_cap` is the capacity of each slot by index.
Status lowerKernels(const Program& p, const SlotLookup& slot_index, const Tokenize& tokens,
                    const std::vector<uint32_t>& slot_cap, Module& m, LoweredKernels* out);

// Index of a kernel by name in Program::kernels, or -1.
int kernelIndex(const Program& p, const std::string& name);

}  // namespace blue::cascade
