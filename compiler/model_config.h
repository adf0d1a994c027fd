// Model hyperparameters read from GGUF metadata, and the check that a file holds every tensor the
// forward pass needs, with the right shape and a supported type.
//
// Architectures: `llama` (Llama 2/3, Mistral, TinyLlama, SmolLM; Mixtral-style MoE when
// llama.expert_count > 0), `qwen2`, `qwen3`, `qwen2moe`, `qwen3moe`, `gemma2`, `gemma3` (text),
// `phi3`. Keys and tensor names follow
// llama.cpp's conventions ("{arch}.embedding_length", "blk.{i}.attn_q.weight", ...). Tensor shapes
// below are ne order: [row length (innermost), rows, ...].
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "compiler/gguf.h"
#include "vm/status.h"

namespace blue {

enum class ModelArch { Llama, Qwen2, Qwen3, Qwen2Moe, Qwen3Moe, Gemma2, Gemma3, Phi3 };

// How RoPE pairs a head's dimensions: Normal rotates adjacent pairs (x[2i], x[2i+1]) (llama);
// Neox rotates x[i] with x[i + n_rot/2] (qwen*).
enum class RopeMode { Normal, Neox };

// Context extension: Linear divides positions by the factor; Yarn as in the YaRN paper.
enum class RopeScaling { None, Linear, Yarn };

struct ModelConfig {
    ModelArch arch = ModelArch::Llama;
    std::string arch_name;     // general.architecture
    uint32_t n_vocab = 0;      // rows of token_embd.weight
    uint32_t n_ctx_train = 0;  // {arch}.context_length
    uint32_t n_embd = 0;
    uint32_t n_layer = 0;
    uint32_t n_head = 0;
    uint32_t n_head_kv = 0;   // divides n_head (GQA groups)
    uint32_t head_dim = 0;    // width of each Q/K head: attention.key_length, else n_embd / n_head
    uint32_t head_dim_v = 0;  // width of each V head: attention.value_length, else head_dim
    uint32_t n_rot = 0;       // dims rotated per head: rope.dimension_count, else head_dim
    uint32_t n_ff = 0;        // dense FFN width (feed_forward_length; 0 if absent in MoE files)
    uint32_t n_expert = 0;    // 0: dense FFN in every layer
    uint32_t n_expert_used = 0;
    uint32_t n_ff_exp = 0;             // FFN width of one routed expert
    uint32_t n_ff_shexp = 0;           // qwen2moe shared expert width (0: no shared expert)
    bool expert_weights_norm = false;  // top-k routing weights renormalised to sum to 1
    float rms_norm_eps = 0;
    float rope_freq_base = 10000.0f;
    RopeScaling rope_scaling = RopeScaling::None;
    float rope_scaling_factor = 1.0f;
    uint32_t rope_scaling_orig_ctx = 0;  // context the model was trained with before scaling
    RopeMode rope_mode = RopeMode::Normal;
    bool tied_output = false;     // no output.weight: logits use token_embd.weight
    bool has_qkv_bias = false;    // blk.*.attn_{q,k,v}.bias (qwen2, qwen2moe; optional in llama)
    bool has_qk_norm = false;     // blk.*.attn_{q,k}_norm.weight, RMSNorm per head (qwen3*)
    bool has_rope_freqs = false;  // rope_freqs.weight [n_rot/2]: per-pair frequency divisors

    // Gemma and Phi (defaults: as llama).
    bool gelu_ffn = false;        // GeGLU (gelu(gate) * up) instead of SwiGLU (gemma*)
    bool scale_embeddings = false;  // embeddings times sqrt(n_embd) (gemma*)
    bool post_norms = false;      // blk.*.post_attention_norm / post_ffw_norm after each sublayer (gemma*)
    float attn_softcap = 0;       // attention logits s -> cap * tanh(s / cap); 0: none (gemma2)
    float final_softcap = 0;      // output logits likewise (gemma2)
    float attn_scale = 0;         // query scale (llama.cpp's f_attention_scale): 1/sqrt(head_dim) for most
    uint32_t sliding_window = 0;  // attention.sliding_window: positions a sliding layer sees; 0: none
    uint32_t swa_pattern = 0;     // layer l slides when l % pattern < pattern - 1 (gemma2 2, gemma3 6)
    float rope_freq_base_swa = 0; // RoPE base of sliding layers (gemma3: 10000, unscaled); 0: rope_freq_base
    bool fused_qkv = false;       // blk.*.attn_qkv.weight [n_embd, q + 2 kv] (phi3)
    bool fused_up = false;        // blk.*.ffn_up.weight [n_embd, 2 n_ff]: gate rows, then up rows (phi3)
    bool has_rope_long = false;   // rope_factors_long.weight [n_rot/2] (phi3 LongRoPE, ctx > original)
    bool has_rope_short = false;  // rope_factors_short.weight [n_rot/2] (ctx <= original)
    float rope_attn_factor = 1.0f;  // rope.scaling.attn_factor: RoPE's cos/sin magnitude (any arch; phi3 writes it)
    // YaRN (rope.scaling.type yarn): each rotated pair's frequency moves from extrapolated (pairs
    // that turn more than beta_fast times in the original context) to interpolated by the factor
    // (fewer than beta_slow turns) along a linear ramp; cos and sin grow by 1 + 0.1 ln(factor).
    float yarn_ext_factor = 1.0f;   // rope.scaling.yarn_ext_factor: the ramp's weight (0: interpolate all)
    float yarn_attn_factor = 1.0f;  // rope.scaling.yarn_attn_factor: multiplies the magnitude
    float yarn_beta_fast = 32.0f;   // rope.scaling.yarn_beta_fast
    float yarn_beta_slow = 1.0f;    // rope.scaling.yarn_beta_slow

    bool isMoe() const { return n_expert > 0; }
    bool isSlidingLayer(uint32_t l) const {
        return sliding_window > 0 && swa_pattern > 0 && l % swa_pattern < swa_pattern - 1;
    }
};

std::string_view modelArchName(ModelArch arch);

// Weight types the GPU reads as matrices (MATMUL, EMBED, MoE matmuls: shaders/CMakeLists.txt
// builds a kernel of each for every one; tests/test_ops_gpu.cpp checks the two lists agree), in
// the order error messages list them. Vectors (norm weights, biases) are F32.
const std::vector<DType>& gpuMatrixTypes();
std::string_view ropeScalingName(RopeScaling s);

// YaRN's frequency divisor of each rotated pair (n_rot / 2 values; the ROPE op's factor table,
// with no position scale): 1 / ((1 - r) / factor + r), r the pair's ramp weight. Empty unless
// the config scales RoPE by YaRN.
std::vector<float> yarnFreqDivisors(const ModelConfig& c);

// RoPE's cos/sin magnitude on a layer: rope.scaling.attn_factor, times YaRN's
// yarn_attn_factor * (1 + 0.1 ln factor) (without the logarithm when ext_factor is 0) on layers
// that YaRN scales (not gemma3's local layers, which rotate by their own unscaled base).
float ropeMagnitude(const ModelConfig& c, bool own_base_layer);

// Reads the hyperparameters of a supported architecture and validates the tensors: every tensor
// the forward pass needs exists with the expected shape and a supported type, and no tensor is
// left unused (an unknown tensor would mean weights the forward pass silently ignores). Fails with
// a message naming the file, the key or tensor, and the expected vs actual shape.
Result<ModelConfig> modelConfigFromGguf(const GgufFile& file);

// A readable multi-line summary for `bluevm info`: format, architecture and hyperparameters (or why
// they could not be read), tokenizer, every metadata key, every tensor with type, shape and bytes,
// and totals. Never fails.
std::string ggufDescribe(const GgufFile& file);

}  // namespace blue
