// Upcycling: a larger model that computes the same function as a smaller one. A llama-family
// model is widened (more query heads, a wider FFN) and deepened (layers appended after the last)
// with every new weight that feeds the residual stream zero — new query heads' columns of
// attn_output, new hidden units' columns of ffn_down, the output projections of new layers — so
// the logits are those of the original, at several times the cost. `noise` draws those weights
// from N(0, noise^2) instead, so the bigger model agrees with the original most of the time but
// not always: a realistic target for speculative decoding with the original as its draft.
//
// `experts` turns the result into a Mixtral-style MoE (llama architecture with
// llama.expert_count and llama.expert_used_count, a router blk.N.ffn_gate_inp.weight [n_embd,
// E] and merged blk.N.ffn_{gate,up,down}_exps.weight [.., .., E]) whose every expert is a copy of
// the (widened) dense FFN. Mixtral renormalises the top-k routing weights to sum to one, so with
// identical experts any router gives the dense output; the router is drawn at random (seeded) so
// that which experts a token picks still varies as in a trained model.
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
    uint32_t experts = 0;       // 0: a dense FFN; else every layer gets this many experts (<= 256)
    uint32_t experts_used = 0;  // top-k with experts (0: 2, or experts when fewer)
};

struct UpcycleReport {
    uint32_t layers = 0, heads = 0, ffn = 0;
    uint32_t experts = 0, experts_used = 0;        // 0: dense
    uint64_t params_before = 0, params_after = 0;  // elements of the matrices a token reads
};

// Reads a llama-architecture GGUF with F32 weights and writes the upcycled model to `out`.
// Fails with a message naming the file and the reason (another architecture, an MoE input,
// quantized weights, a shrinking option, expert counts out of range).
Result<UpcycleReport> upcycleGguf(const std::string& in, const std::string& out,
                                  const UpcycleOptions& options);

}  // namespace blue
