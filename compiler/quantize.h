// `bluevm quantize`: rewrites a GGUF model with its weight matrices in another element type.
//
// Which tensors change: weight matrices (2-D and 3-D tensors whose name ends in "weight", except
// norms and the MoE router `ffn_gate_inp`) take the requested type, adjusted per tensor by a mix
// that follows llama.cpp's llama_tensor_get_type (see quantizeTensorType); every other tensor
// (norms, biases, router) is stored as F32. A matrix whose rows are not a whole number of the
// chosen type's blocks falls back to quantFallback's type (stories260K's ffn_down, rows of 172,
// becomes F16). Metadata is copied unchanged, with general.file_type set to llama.cpp's
// LLAMA_FTYPE for the choice and general.quantization_version to 2.
//
// The output is streamed: tensors are read from the memory-mapped input and encoded in chunks of
// rows straight into the file, on several threads, so a model never sits in memory twice. The
// result does not depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/gguf.h"
#include "compiler/model_config.h"
#include "vm/dtype.h"
#include "vm/status.h"

namespace blue {

// A quantize target: the type most matrices take, and llama.cpp's LLAMA_FTYPE naming its mix.
// The K-quants come in llama.cpp's sizes (Q2_K 10, Q2_K_S 21, Q3_K_S 11, Q3_K_M 12, Q3_K_L 13,
// Q4_K_S 14, Q4_K_M 15, Q5_K_S 16, Q5_K_M 17, Q6_K 18); every other target has one mix, its plain
// ftype (F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8, Q5_1 9, IQ4_NL 25, IQ4_XS 30, BF16 32,
// TQ1_0 36, TQ2_0 37; MXFP4 is 38, MXFP4_MOE: experts in MXFP4, other matrices Q8_0). A DType
// converts to its default mix: q3_k is Q3_K_M, q4_k Q4_K_M, q5_k Q5_K_M, q2_k Q2_K
// (quantizeIsTarget asserted).
struct QuantizeTarget {
    DType type = DType::F32;
    uint32_t file_type = 0;
    QuantizeTarget() = default;
    QuantizeTarget(DType t);  // NOLINT(google-explicit-constructor): a type is its default mix
    QuantizeTarget(DType t, uint32_t ftype) : type(t), file_type(ftype) {}
    bool operator==(const QuantizeTarget&) const = default;
};

// The --type choices (case-insensitive): q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q2_k_s q3_k_s q3_k_m
// (= q3_k) q3_k_l q4_k_s q4_k_m (= q4_k) q5_k_s q5_k_m (= q5_k) q6_k iq4_nl iq4_xs f16 bf16 f32
// tq1_0 tq2_0 mxfp4. nullopt for any other name.
std::optional<QuantizeTarget> quantizeTargetFromName(std::string_view name);
// "q8_0, q4_0, ..." for help texts and error messages.
std::string quantizeTypeNames();
// True for the types a target can have.
bool quantizeIsTarget(DType type);
// llama.cpp's LLAMA_FTYPE of a type's default mix. Precondition (asserted): quantizeIsTarget(type).
uint32_t quantizeFileType(DType type);

// What the mix rules need to know about a model.
struct QuantizeModelInfo {
    uint32_t n_layer = 0;
    uint32_t n_gqa = 1;      // n_head / n_head_kv
    uint32_t n_expert = 0;   // 0: dense
    bool has_output = true;  // false: token_embd.weight doubles as the output matrix
};
QuantizeModelInfo quantizeModelInfo(const ModelConfig& config);

// Whether a tensor is a weight matrix that quantization changes (see the file comment).
bool quantizeIsWeightMatrix(std::string_view name, uint32_t n_dims);

// The type the mix gives a weight matrix with rows of `row_len` (> 0) elements when `target` is
// asked for, before the row-length fallback. `pure` gives `target.type` itself; otherwise
// quantized targets follow llama.cpp's mixes:
//   - output.weight (token_embd.weight when the output is tied): Q6_K, or Q8_0 when the target is
//     Q8_0 or the rows are not whole blocks of the target;
//   - Q2_K:   attn_v Q3_K (Q4_K when n_gqa >= 4); ffn_down, attn_output Q3_K;
//   - Q2_K_S: attn_v Q4_K when n_gqa >= 4; ffn_down Q4_K in the first n_layer/8 layers;
//   - Q3_K_S: Q3_K throughout (but the output);
//   - Q3_K_M: attn_v Q5_K in layers 0-1, else Q4_K; ffn_down Q5_K in the first n_layer/16
//             layers, else Q4_K; attn_output Q4_K;
//   - Q3_K_L: attn_v, ffn_down and attn_output Q5_K;
//   - Q4_K_S: attn_v Q5_K in layers 0-3; ffn_down Q5_K in the first n_layer/8 layers;
//   - Q4_K_M, Q5_K_M: attn_v and ffn_down Q6_K in the layers where llama.cpp's use_more_bits
//     holds (the first and last eighth, and every third layer between);
//   - Q5_K_S: Q5_K throughout (but the output);
//   - IQ4_NL, IQ4_XS: attn_v Q5_K when n_gqa >= 4; ffn_down Q5_K in the first n_layer/8 layers
//     (llama.cpp's rule without an importance matrix);
//   - 8-expert models: attn_v and attn_k Q8_0 (any quantized target); attn_output Q5_K for
//     Q2_K, Q3_K_S, Q3_K_M, Q4_K_S, Q4_K_M, IQ4_NL and IQ4_XS;
//   - attn_qkv (fused QKV): Q3_K_M and Q3_K_L Q4_K, Q4_K_M Q5_K, Q5_K_M Q6_K.
// Not reproduced: llama.cpp's 70B-only attn_v rule, Falcon rules, the 1- to 3-bit IQ types and
// imatrix rules.
// Layers are read from the "blk.N." name prefix. f16/bf16/f32 targets give every matrix that type.
DType quantizeMixType(std::string_view name, int64_t row_len, QuantizeTarget target,
                      const QuantizeModelInfo& model, bool pure = false);
// The type the matrix is stored in: quantFallback(quantizeMixType(...), row_len).
DType quantizeTensorType(std::string_view name, int64_t row_len, QuantizeTarget target,
                         const QuantizeModelInfo& model, bool pure = false);

// The plan for one tensor of the input.
struct QuantizeTensorPlan {
    std::string name;
    DType from = DType::F32;    // type in the input
    DType to = DType::F32;      // type in the output
    DType wanted = DType::F32;  // what the mix chose before the row-length fallback
    bool matrix = false;        // a weight matrix (quantizeIsWeightMatrix)
    int64_t row_len = 0;
    uint64_t bytes_in = 0, bytes_out = 0;
};

// Plans every tensor of a model file for `target`. Fails when the file is not a model
// modelConfigFromGguf accepts.
Result<std::vector<QuantizeTensorPlan>> quantizePlan(const GgufFile& file, QuantizeTarget target,
                                                     bool pure = false);

struct QuantizeOptions {
    uint32_t threads = 0;  // 0: std::thread::hardware_concurrency()
    bool pure = false;  // no mix: every matrix takes the target type (row fallback still applies)
    // Called on the calling thread as the output is written: input bytes processed so far and in
    // all; the last call has done == total.
    std::function<void(uint64_t done, uint64_t total)> progress;
    // Called once per note (row-length fallbacks, requantized input) before any data is written.
    std::function<void(const std::string& note)> on_note;
};

struct QuantizeReport {
    std::vector<QuantizeTensorPlan> tensors;
    std::vector<std::string> notes;  // as passed to on_note
    uint64_t file_bytes_in = 0, file_bytes_out = 0;
    uint32_t file_type = 0;

    // "35 Q8_0, 5 F16, 11 F32": output tensors per type, most frequent first.
    std::string typeSummary() const;
};

// Quantizes the model at `in` into a new file at `out` (replaced if it exists; removed again on
// failure). Fails, with one line naming the file and what is wrong, when `in` cannot be read or
// is not a model BlueVM can load, `out` is `in` or cannot be written, or a tensor to convert
// holds a non-finite value. Quantized input is decoded and re-encoded (a note says so) unless its type is already the chosen one, when it is copied.
Result<QuantizeReport> quantizeGguf(const std::string& in, const std::string& out, QuantizeTarget target,
                                    const QuantizeOptions& options = {});

// Runs fn(first, count) over disjoint ranges that cover [0, n_rows), on up to `threads` threads
// (the caller's included; small jobs run on the caller only), and returns when all are done.
// Ranges depend only on n_rows and threads. `min_rows_per_thread` keeps tiny jobs on one thread.
void quantizeParallelRows(uint64_t n_rows, uint32_t threads,
                          const std::function<void(uint64_t first, uint64_t count)>& fn,
                          uint64_t min_rows_per_thread = 1);

}  // namespace blue
