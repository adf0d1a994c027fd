// The quantize targets and the per-tensor type mix (see quantize.h). The rules restate the
// behaviour of llama.cpp's llama_tensor_get_type for the ftypes BlueVM offers (Q2_K, Q2_K_S, the
// S/M/L sizes of Q3_K to Q5_K, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4_MOE and the plain types),
// so a BlueVM q4_k_s file has the tensor types a llama.cpp Q4_K_S file of the same model has.
#include <cassert>
#include <cctype>
#include <charconv>

#include "compiler/quantize.h"
#include "vm/quant.h"

namespace blue {

namespace {

// llama.cpp's LLAMA_FTYPE values of the mixes whose rules differ.
enum FileType : uint32_t {
    kQ2_K = 10, kQ3_K_S = 11, kQ3_K_M = 12, kQ3_K_L = 13, kQ4_K_S = 14, kQ4_K_M = 15,
    kQ5_K_S = 16, kQ5_K_M = 17, kQ2_K_S = 21, kIQ4_NL = 25, kIQ4_XS = 30,
};

struct Target {
    DType type;
    std::string_view name;
    uint32_t file_type;    // llama.cpp's LLAMA_FTYPE
    bool is_default;       // the type's default mix (what a bare DType means)
    std::string_view alias;  // another accepted name ("q4_k" for q4_k_m), or empty
};

constexpr Target kTargets[] = {
    {DType::Q8_0, "q8_0", 7, true, ""},
    {DType::Q4_0, "q4_0", 2, true, ""},
    {DType::Q4_1, "q4_1", 3, true, ""},
    {DType::Q5_0, "q5_0", 8, true, ""},
    {DType::Q5_1, "q5_1", 9, true, ""},
    {DType::Q2_K, "q2_k", kQ2_K, true, ""},
    {DType::Q2_K, "q2_k_s", kQ2_K_S, false, ""},
    {DType::Q3_K, "q3_k_s", kQ3_K_S, false, ""},
    {DType::Q3_K, "q3_k_m", kQ3_K_M, true, "q3_k"},
    {DType::Q3_K, "q3_k_l", kQ3_K_L, false, ""},
    {DType::Q4_K, "q4_k_s", kQ4_K_S, false, ""},
    {DType::Q4_K, "q4_k_m", kQ4_K_M, true, "q4_k"},
    {DType::Q5_K, "q5_k_s", kQ5_K_S, false, ""},
    {DType::Q5_K, "q5_k_m", kQ5_K_M, true, "q5_k"},
    {DType::Q6_K, "q6_k", 18, true, ""},
    {DType::IQ4_NL, "iq4_nl", kIQ4_NL, true, ""},
    {DType::IQ4_XS, "iq4_xs", kIQ4_XS, true, ""},
    {DType::F16, "f16", 1, true, ""},
    {DType::BF16, "bf16", 32, true, ""},
    {DType::F32, "f32", 0, true, ""},
    {DType::TQ1_0, "tq1_0", 36, true, ""},
    {DType::TQ2_0, "tq2_0", 37, true, ""},
    {DType::MXFP4, "mxfp4", 38, true, ""},
};

bool sameName(std::string_view a, std::string_view b) {
    if (a.size() != b.size() || b.empty()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
    }
    return true;
}

bool contains(std::string_view s, std::string_view part) {
    return s.find(part) != std::string_view::npos;
}

bool isBlockType(DType t) {
    return dtypeInfo(t)->block_elems > 1;
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

DType attnVType(QuantizeTarget target, int layer, const QuantizeModelInfo& m) {
    DType t = target.type;
    const int n = int(m.n_layer);
    const bool gqa4 = m.n_gqa >= 4;
    switch (target.file_type) {
        case kQ2_K: t = gqa4 ? DType::Q4_K : DType::Q3_K; break;
        case kQ2_K_S: if (gqa4) t = DType::Q4_K; break;
        case kQ3_K_M: t = layer < 2 ? DType::Q5_K : DType::Q4_K; break;
        case kQ3_K_L: t = DType::Q5_K; break;
        case kIQ4_NL:
        case kIQ4_XS: if (gqa4) t = DType::Q5_K; break;
        case kQ4_K_M:
        case kQ5_K_M: if (moreBits(layer, n)) t = DType::Q6_K; break;
        case kQ4_K_S: if (layer < 4) t = DType::Q5_K; break;
        default: break;
    }
    if (m.n_expert == 8) t = DType::Q8_0;
    return t;
}

DType ffnDownType(QuantizeTarget target, int layer, const QuantizeModelInfo& m) {
    const int n = int(m.n_layer);
    switch (target.file_type) {
        case kQ2_K: return DType::Q3_K;
        case kQ2_K_S: return layer < n / 8 ? DType::Q4_K : target.type;
        case kQ3_K_M: return layer < n / 16 ? DType::Q5_K : DType::Q4_K;
        case kQ3_K_L: return DType::Q5_K;
        case kQ4_K_M:
        case kQ5_K_M: return moreBits(layer, n) ? DType::Q6_K : target.type;
        case kIQ4_NL:  // IQ4: llama.cpp's rule without an imatrix
        case kIQ4_XS:
        case kQ4_K_S: return layer < n / 8 ? DType::Q5_K : target.type;
        default: return target.type;
    }
}

DType attnOutputType(QuantizeTarget target, const QuantizeModelInfo& m) {
    const uint32_t ft = target.file_type;
    if (m.n_expert == 8) {
        bool low = ft == kQ2_K || ft == kQ3_K_S || ft == kQ3_K_M || ft == kQ4_K_S || ft == kQ4_K_M ||
                   ft == kIQ4_NL || ft == kIQ4_XS;
        return low ? DType::Q5_K : target.type;
    }
    if (ft == kQ2_K) return DType::Q3_K;
    if (ft == kQ3_K_M) return DType::Q4_K;
    if (ft == kQ3_K_L) return DType::Q5_K;
    return target.type;
}

DType mixType(std::string_view name, int64_t row_len, QuantizeTarget target, const QuantizeModelInfo& m) {
    const DType type = target.type;
    // MXFP4_MOE: the experts in MXFP4, every other matrix in Q8_0.
    if (type == DType::MXFP4) return contains(name, "_exps.weight") ? DType::MXFP4 : DType::Q8_0;
    bool output = name == "output.weight" || (!m.has_output && name == "token_embd.weight");
    if (output) {
        if (row_len % dtypeInfo(type)->block_elems != 0) return DType::Q8_0;
        return type == DType::Q8_0 ? DType::Q8_0 : DType::Q6_K;
    }
    if (name == "token_embd.weight") {
        return type == DType::TQ1_0 || type == DType::TQ2_0 ? DType::Q4_K : type;
    }
    int layer = layerOf(name);
    if (contains(name, "attn_v.weight")) return attnVType(target, layer, m);
    if (contains(name, "attn_k.weight")) return m.n_expert == 8 ? DType::Q8_0 : type;
    if (contains(name, "ffn_down")) return ffnDownType(target, layer, m);
    if (contains(name, "attn_output.weight")) return attnOutputType(target, m);
    if (contains(name, "attn_qkv.weight")) {
        switch (target.file_type) {
            case kQ3_K_M:
            case kQ3_K_L: return DType::Q4_K;
            case kQ4_K_M: return DType::Q5_K;
            case kQ5_K_M: return DType::Q6_K;
            default: break;
        }
    }
    return type;
}

}  // namespace

QuantizeTarget::QuantizeTarget(DType t) : type(t) {
    for (const Target& e : kTargets) {
        if (e.type == t && e.is_default) file_type = e.file_type;
    }
}

std::optional<QuantizeTarget> quantizeTargetFromName(std::string_view name) {
    for (const Target& t : kTargets) {
        if (sameName(name, t.name) || sameName(name, t.alias)) return QuantizeTarget(t.type, t.file_type);
    }
    return std::nullopt;
}

std::string quantizeTypeNames() {
    std::string s;
    for (const Target& t : kTargets) {
        if (!s.empty()) s += ", ";
        s += t.name;
        if (!t.alias.empty()) s += " (" + std::string(t.alias) + ")";
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
    assert(quantizeIsTarget(type) && "not a quantize target");
    return QuantizeTarget(type).file_type;
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

DType quantizeMixType(std::string_view name, int64_t row_len, QuantizeTarget target,
                      const QuantizeModelInfo& model, bool pure) {
    assert(quantizeIsTarget(target.type) && row_len > 0);
    if (pure || !isBlockType(target.type)) return target.type;
    return mixType(name, row_len, target, model);
}

DType quantizeTensorType(std::string_view name, int64_t row_len, QuantizeTarget target,
                         const QuantizeModelInfo& model, bool pure) {
    return quantFallback(quantizeMixType(name, row_len, target, model, pure), row_len);
}

}  // namespace blue
