// The quantize targets and the per-tensor type mix (see quantize.h). The rules restate the
// behaviour of llama.cpp's llama_tensor_get_type for the ftypes BlueVM offers (Q2_K, Q3_K_M,
// Q4_K_M, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4_MOE and the plain types), so a BlueVM q4_k file has the tensor
// types a llama.cpp Q4_K_M file of the same model has.
#include <cassert>
#include <cctype>
#include <charconv>

#include "compiler/quantize.h"
#include "vm/quant.h"

namespace blue {

namespace {

struct Target {
    DType type;
    std::string_view name;
    uint32_t file_type;  // llama.cpp's LLAMA_FTYPE
};

constexpr Target kTargets[] = {
    {DType::Q8_0, "q8_0", 7},  {DType::Q4_0, "q4_0", 2},      {DType::Q4_1, "q4_1", 3},
    {DType::Q5_0, "q5_0", 8},  {DType::Q5_1, "q5_1", 9},      {DType::Q2_K, "q2_k", 10},
    {DType::Q3_K, "q3_k", 12}, {DType::Q4_K, "q4_k", 15},     {DType::Q5_K, "q5_k", 17},
    {DType::Q6_K, "q6_k", 18}, {DType::IQ4_NL, "iq4_nl", 25}, {DType::IQ4_XS, "iq4_xs", 30},
    {DType::F16, "f16", 1},    {DType::BF16, "bf16", 32},     {DType::F32, "f32", 0},
    {DType::TQ1_0, "tq1_0", 36}, {DType::TQ2_0, "tq2_0", 37}, {DType::MXFP4, "mxfp4", 38},
};

bool contains(std::string_view s, std::string_view part) {
    return s.find(part) != std::string_view::npos;
}

bool isBlockType(DType t) {
    return dtypeInfo(t)->block_elems > 1;
}

bool isIq4(DType t) {
    return t == DType::IQ4_NL || t == DType::IQ4_XS;
}

// The N of a "blk.N." prefix; -1 when the name has none.
int layerOf(std::string_view name) {
    constexpr std::string_view kPrefix = "blk.";
    if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
    int layer = -1;
    const char* first = name.data() + kPrefix.size();
    auto [end, ec] = std::from_chars(first, name.data() + name.size(), layer);
    if (ec != std::errc() || end == first || *end != '.') return -1;
    return layer;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool moreBits(int layer, int n_layer) {
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

DType attnVType(DType target, int layer, const QuantizeModelInfo& m) {
    DType t = target;
    int n = int(m.n_layer);
    if (target == DType::Q2_K) t = m.n_gqa >= 4 ? DType::Q4_K : DType::Q3_K;
    if (target == DType::Q3_K) t = layer < 2 ? DType::Q5_K : DType::Q4_K;
    if (isIq4(target) && m.n_gqa >= 4) t = DType::Q5_K;
    if ((target == DType::Q4_K || target == DType::Q5_K) && moreBits(layer, n)) t = DType::Q6_K;
    if (m.n_expert == 8) t = DType::Q8_0;
    return t;
}

DType ffnDownType(DType target, int layer, const QuantizeModelInfo& m) {
    int n = int(m.n_layer);
    if (target == DType::Q2_K) return DType::Q3_K;
    if (target == DType::Q3_K) return layer < n / 16 ? DType::Q5_K : DType::Q4_K;
    if ((target == DType::Q4_K || target == DType::Q5_K) && moreBits(layer, n)) return DType::Q6_K;
    if (isIq4(target) && layer < n / 8) return DType::Q5_K;  // llama.cpp: without an imatrix
    return target;
}

DType attnOutputType(DType target, const QuantizeModelInfo& m) {
    if (m.n_expert == 8) {
        bool low = target == DType::Q2_K || target == DType::Q3_K || target == DType::Q4_K ||
                   isIq4(target);
        return low ? DType::Q5_K : target;
    }
    if (target == DType::Q2_K) return DType::Q3_K;
    if (target == DType::Q3_K) return DType::Q4_K;
    return target;
}

DType mixType(std::string_view name, int64_t row_len, DType target, const QuantizeModelInfo& m) {
    // MXFP4_MOE: the experts in MXFP4, every other matrix in Q8_0.
    if (target == DType::MXFP4) return contains(name, "_exps.weight") ? DType::MXFP4 : DType::Q8_0;
    bool output = name == "output.weight" || (!m.has_output && name == "token_embd.weight");
    if (output) {
        if (row_len % dtypeInfo(target)->block_elems != 0) return DType::Q8_0;
        return target == DType::Q8_0 ? DType::Q8_0 : DType::Q6_K;
    }
    if (name == "token_embd.weight") {
        return target == DType::TQ1_0 || target == DType::TQ2_0 ? DType::Q4_K : target;
    }
    int layer = layerOf(name);
    if (contains(name, "attn_v.weight")) return attnVType(target, layer, m);
    if (contains(name, "attn_k.weight")) return m.n_expert == 8 ? DType::Q8_0 : target;
    if (contains(name, "ffn_down")) return ffnDownType(target, layer, m);
    if (contains(name, "attn_output.weight")) return attnOutputType(target, m);
    if (contains(name, "attn_qkv.weight")) {
        if (target == DType::Q3_K) return DType::Q4_K;
        if (target == DType::Q4_K) return DType::Q5_K;
        if (target == DType::Q5_K) return DType::Q6_K;
    }
    return target;
}

}  // namespace

std::optional<DType> quantizeTypeFromName(std::string_view name) {
    for (const Target& t : kTargets) {
        if (t.name.size() != name.size()) continue;
        bool same = true;
        for (size_t i = 0; i < name.size(); ++i) {
            same = same && std::tolower(static_cast<unsigned char>(name[i])) == t.name[i];
        }
        if (same) return t.type;
    }
    return std::nullopt;
}

std::string quantizeTypeNames() {
    std::string s;
    for (const Target& t : kTargets) {
        if (!s.empty()) s += ", ";
        s += t.name;
    }
    return s;
}

bool quantizeIsTarget(DType type) {
    for (const Target& t : kTargets) {
        if (t.type == type) return true;
    }
    return false;
}

uint32_t quantizeFileType(DType type) {
    for (const Target& t : kTargets) {
        if (t.type == type) return t.file_type;
    }
    assert(false && "not a quantize target");
    return 0;
}

QuantizeModelInfo quantizeModelInfo(const ModelConfig& config) {
    QuantizeModelInfo m;
    m.n_layer = config.n_layer;
    m.n_gqa = config.n_head_kv ? config.n_head / config.n_head_kv : 1;
    m.n_expert = config.n_expert;
    m.has_output = !config.tied_output;
    return m;
}

bool quantizeIsWeightMatrix(std::string_view name, uint32_t n_dims) {
    constexpr std::string_view kSuffix = "weight";
    if (n_dims < 2 || name.size() < kSuffix.size()) return false;
    if (name.substr(name.size() - kSuffix.size()) != kSuffix) return false;
    return !contains(name, "_norm.weight") && !contains(name, "ffn_gate_inp.weight");
}

DType quantizeMixType(std::string_view name, int64_t row_len, DType target,
                      const QuantizeModelInfo& model, bool pure) {
    assert(quantizeIsTarget(target) && row_len > 0);
    if (pure || !isBlockType(target)) return target;
    return mixType(name, row_len, target, model);
}

DType quantizeTensorType(std::string_view name, int64_t row_len, DType target,
                         const QuantizeModelInfo& model, bool pure) {
    return quantFallback(quantizeMixType(name, row_len, target, model, pure), row_len);
}

}  // namespace blue
