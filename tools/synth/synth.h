// blue-synth: synthetic GGUF models with random weights and real shapes, for benchmarks and tests.
//
// A model is described by a SynthConfig (presets for the shapes the project measures, overridable
// field by field). Weights are a seeded, counter-based hash of (seed, tensor name, element index),
// shaped like N(0, 0.02) (a sum of four uniforms), so any row can be produced independently and
// the same seed gives the same bytes on any thread count; norm weights are 1. Tensors are produced
// while the file is written, row chunk by row chunk, so even the 1.1B preset never sits in memory.
// Every file carries a tokenizer of the requested vocabulary size that BlueVM's tokenizers accept
// (SentencePiece-style for llama, byte-level BPE with merges for the qwen architectures) and
// passes modelConfigFromGguf.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/gguf.h"
#include "vm/dtype.h"
#include "vm/status.h"

namespace blue {

struct SynthConfig {
    std::string name;  // general.name
    // "llama" (dense or Mixtral-style MoE), "qwen2", "qwen2moe" (routed experts, a shared expert
    // gated by a sigmoid, Q/K/V biases), "qwen3moe" (routed experts, per-head Q/K RMSNorm),
    // "gemma2" (post-sublayer norms, soft-capped logits, sliding window on even layers),
    // "gemma3" (post-sublayer norms, Q/K RMSNorm, sliding window on 5 layers of 6) or "phi3"
    // (fused attn_qkv and gate/up, LongRoPE factors)
    std::string arch = "llama";
    uint32_t dim = 0;  // embedding width
    uint32_t n_layer = 0;
    uint32_t n_head = 0;
    uint32_t n_head_kv = 0;  // divides n_head
    uint32_t n_ff = 0;       // FFN width (of each expert in an MoE model)
    uint32_t n_vocab = 0;
    uint32_t n_ctx = 2048;       // context_length metadata
    uint32_t n_expert = 0;       // 0: dense FFN
    uint32_t n_expert_used = 0;  // top-k routing, 1..n_expert for MoE
    uint32_t n_ff_shexp = 0;     // qwen2moe's shared expert width (other archs: 0)
    bool qkv_bias = false;       // attn_{q,k,v}.bias (qwen2 and qwen2moe always have them)
    bool tied_output = false;    // no output.weight: logits use token_embd.weight
    float rope_base = 10000.0f;
    float norm_eps = 1e-5f;
    uint32_t sliding_window = 0;  // gemma*: attention.sliding_window (> 0)
    uint32_t orig_ctx = 0;        // rope.scaling.original_context_length (phi3: 0 means no LongRoPE factors)
    float attn_factor = 1.0f;     // phi3: rope.scaling.attn_factor
    float yarn_factor = 0.0f;     // rope.scaling.type yarn with this factor from orig_ctx; 0: none

    uint32_t head_dim = 0;        // attention.key_length/value_length; 0: dim / n_head (no keys written)
    bool mistral_tokens = false;  // llama vocabulary: Mistral v3's control tokens ([INST], [TOOL_CALLS], ...)

    uint32_t headDim() const { return head_dim ? head_dim : n_head ? dim / n_head : 0; }
    bool qkNorm() const { return arch == "qwen3moe" || arch == "gemma3"; }  // attn_{q,k}_norm.weight [head_dim]
    bool isGemma() const { return arch == "gemma2" || arch == "gemma3"; }
};

// The presets: stories15M, stories110M, tinyllama-1.1b, qwen2-0.5b, peer-dim256, peer-moe,
// peer-dim1024, mixtral-tiny, qwen2moe-tiny, qwen3moe-tiny, gemma2-tiny, gemma3-tiny, phi3-tiny,
// qwen2-yarn-tiny, mistral-tiny. nullopt for other names.
std::optional<SynthConfig> synthPreset(std::string_view name);
std::vector<std::string_view> synthPresetNames();

// Checks a config after overrides: a known architecture, non-zero sizes, dim a multiple of
// n_head with an even head width, n_head a multiple of n_head_kv, 1 <= n_expert_used <= n_expert
// for MoE, experts only in llama and the *moe architectures (which need them), Q/K/V biases in
// qwen2 and qwen2moe, a shared expert in qwen2moe only (and always), a vocabulary large enough
// for the tokenizer (>= 260), and sizes below 2^24 per dimension. The message names the field.
Status synthValidate(const SynthConfig& config);

// Parameters (elements of all tensors) of the model the config describes.
uint64_t synthParamCount(const SynthConfig& config);

struct SynthOptions {
    DType type = DType::F32;  // a quantize target (quantizeIsTarget); matrices follow its mix
    bool pure = false;        // every matrix in `type` (row fallbacks remain)
    uint64_t seed = 1;
    uint32_t threads = 0;  // 0: all cores
    // Called on the writing thread after each chunk: bytes of tensor data produced so far and in
    // all.
    std::function<void(uint64_t done, uint64_t total)> progress;
};

// Sets the metadata, the tokenizer and the tensors of a synthetic model on `writer` (fresh);
// tensor data is generated when the writer writes. Fails when the config is invalid or the
// type is not a quantize target.
Status synthBuild(const SynthConfig& config, const SynthOptions& options, GgufWriter* writer);

// Writes the model to `path` (synthBuild, then GgufWriter::write).
Status synthWrite(const SynthConfig& config, const SynthOptions& options, const std::string& path);

// Tokenizer metadata (tokenizer.ggml.*) with exactly n_vocab tokens (>= 260).
// Llama (SentencePiece-style): <unk> <s> </s>, the byte tokens <0x00>..<0xFF>, then pieces
// ("▁", letters, digits, punctuation, then letter strings with and without "▁") with descending
// scores; bos 1, eos 2, unk 0. mistral_tokens: Mistral v3's seven control tokens ([INST],
// [/INST], [TOOL_CALLS], [AVAILABLE_TOOLS], [/AVAILABLE_TOOLS], [TOOL_RESULTS], [/TOOL_RESULTS])
// follow </s> (n_vocab >= 267).
void synthAddLlamaVocab(GgufWriter* writer, uint32_t n_vocab, bool mistral_tokens = false);
// gpt2 (byte-level BPE, pre-tokenizer "qwen2"): the 256 byte symbols in GPT-2's order, one token
// per merge (letter strings with and without the space symbol "Ġ"), then <|endoftext|>
// <|im_start|> <|im_end|> (ids 151643.. in the full-size vocabulary), then [PADn] tokens up to
// n_vocab; a ChatML chat template.
void synthAddGpt2Vocab(GgufWriter* writer, uint32_t n_vocab);

}  // namespace blue
