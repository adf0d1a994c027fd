// Upcycling: a larger model that computes the same function as a smaller one. A llama-family
// model is widened (more query heads, a wider FFN) and deepened (layers appended after the last)
// with every new weight that feeds the residual stream zero — new query heads' columns of
// attn_output, new hidden units' columns of ffn_down, the output projections of new layers — so
// the logits are those of the original, at several times the cost. `noise` draws those weights
// from N(0, noise^2) instead, so the bigger model agrees with the original most of the time but
// not always: a realistic target for speculative decoding with the original as its draft.
#pragma once

#include <cstdint>
#include <string>

#include "vm/status.h"

namespace blue {

struct UpcycleOptions {
    uint32_t extra_layers = 0;  // appended after the last layer
    uint32_t head_factor = 1;   // query heads x this (KV heads unchanged)
    uint32_t ffn = 0;           // new FFN width (0: unchanged; must not shrink)
    float noise = 0.0f;         // std of the new residual-facing weights (0: the same function)
    uint32_t seed = 1;
};

struct UpcycleReport {
    uint32_t layers = 0, heads = 0, ffn = 0;
    uint64_t params_before = 0, params_after = 0;  // elements of the matrices a token reads
};

// Reads a llama-architecture GGUF with F32 weights and writes the upcycled model to `out`.
// Fails with a message naming the file and the reason (another architecture, quantized weights,
// a shrinking option).
Result<UpcycleReport> upcycleGguf(const std::string& in, const std::string& out, const UpcycleOptions& options);

}  // namespace blue
