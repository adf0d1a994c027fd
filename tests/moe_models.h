// Small MoE models for tests: presets shrunk to test size (tests/test_moe.cpp), the model the
// expert-cache tests page under a budget (tests/test_memory.cpp through `bluevm generate`,
// tests/test_server.cpp over HTTP), and the budget that leaves a given number of cache slots per
// layer.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "tools/synth/synth.h"

namespace blue::test {

// A preset shrunk to test size, keeping its experts and the rest of its shape: 2 layers, 4 heads
// (2 KV heads), the given width, FFN width and vocabulary (dims that quantized blocks divide).
inline SynthConfig shrunkPreset(const char* preset, uint32_t dim, uint32_t ff, uint32_t vocab) {
    std::optional<SynthConfig> c = synthPreset(preset);
    REQUIRE_MESSAGE(c.has_value(), preset);
    c->dim = dim;
    c->n_layer = 2;
    c->n_head = 4;
    c->n_head_kv = 2;
    c->n_ff = ff;
    c->n_vocab = vocab;
    return *c;
}

// mixtral-tiny's experts (8, top-2) at dim 128, 2 layers, ff 128, vocab 512, Q4_0: written to
// `path`; its config returned.
inline SynthConfig writeSmallMoe(const std::string& path) {
    const SynthConfig c = shrunkPreset("mixtral-tiny", 128, 128, 512);
    SynthOptions opt;
    opt.type = DType::Q4_0;
    Status s = synthWrite(c, opt, path);
    REQUIRE_MESSAGE(s, s.message());
    return c;
}

// A budget that leaves `slots` cache slots per layer (and half a slot to spare): `vram` is the
// device memory the model takes without a budget, `per_slot` one slot's bytes over all layers
// (expert_cache_bytes / slots of a run one byte short, which has experts - 1 slots).
inline uint64_t budgetForSlots(uint64_t vram, uint64_t per_slot, uint32_t experts, uint32_t slots) {
    return vram - per_slot * (experts - slots) + per_slot / 2;
}

}  // namespace blue::test
