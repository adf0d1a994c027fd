// A plain C++ forward pass of gemma2, gemma3, phi3 and qwen2 (YaRN included) over an F32 GGUF
// file, written from llama.cpp's graphs (build_gemma2, build_gemma3, build_phi3, build_qwen2) and independent of Blue-IR: no KV
// cache, every position recomputed, doubles for the sums. tests/test_archs.cpp checks the lowered
// programs against it.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/gguf.h"
#include "compiler/model_config.h"

namespace blue::test {

// Log-softmax of the logits at every position of `tokens` (positions 0..n-1), for a context of
// `ctx` positions (phi3 picks its LongRoPE factors by it). The file's matrices must be F32.
std::vector<std::vector<double>> naiveLogProbs(const GgufFile& file, const ModelConfig& cfg,
                                               uint32_t ctx, const std::vector<uint32_t>& tokens);

// The hidden state after the output norm at every position (what embeddings pool).
std::vector<std::vector<double>> naiveHidden(const GgufFile& file, const ModelConfig& cfg, uint32_t ctx,
                                             const std::vector<uint32_t>& tokens);

}  // namespace blue::test
