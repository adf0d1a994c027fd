// Upcycling (see upcycle.h).
#include "compiler/upcycle.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "compiler/gguf.h"
#include "compiler/model_config.h"

namespace blue {

namespace {

constexpr uint32_t kMaxExperts = 256;  // llama.cpp's LLAMA_MAX_EXPERTS

// A row-major F32 matrix of `rows` rows of `cols` (GGUF ne = {cols, rows}).
struct Matrix {
    uint64_t cols = 0, rows = 0;
    std::vector<float> v;
    Matrix() = default;
    Matrix(uint64_t c, uint64_t r) : cols(c), rows(r), v(c * r, 0.0f) {}
    float& at(uint64_t r, uint64_t c) { return v[r * cols + c]; }
};

struct Builder {
    const GgufFile& g;
    const ModelConfig& cfg;
    const UpcycleOptions& opt;
    GgufWriter w;
    std::mt19937 rng;
    std::vector<std::unique_ptr<std::vector<float>>> owned;
    uint64_t params_after = 0;

    Result<Matrix> read(const std::string& name) const {
        const GgufTensor* t = g.findTensor(name);
        if (!t) return BLUE_ERROR("%s: no tensor '%s'", g.name().c_str(), name.c_str());
        if (t->type != DType::F32) {
            return BLUE_ERROR("%s: tensor '%s' is %s; upcycling reads F32 models", g.name().c_str(),
                              name.c_str(), std::string(dtypeName(t->type)).c_str());
        }
        Matrix m(uint64_t(t->ne[0]), uint64_t(t->rows()));
        std::span<const uint8_t> bytes = g.rawTensorData(*t);
        std::memcpy(m.v.data(), bytes.data(), m.v.size() * 4);
        return m;
    }
    float gauss(float std) { return std::normal_distribution<float>(0.0f, std)(rng); }
    Status add(const std::string& name, Matrix m, bool vector = false) {
        auto data = std::make_unique<std::vector<float>>(std::move(m.v));
        std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data->data()),
                                       data->size() * 4);
        std::vector<int64_t> dims = vector ? std::vector<int64_t>{int64_t(m.cols)}
                                           : std::vector<int64_t>{int64_t(m.cols), int64_t(m.rows)};
        if (!vector) params_after += m.cols * m.rows;
        owned.push_back(std::move(data));
        return w.addTensor(name, DType::F32, dims, bytes);
    }
    // E copies of `m` as one [cols, rows, E] tensor; a token reads `used` of them.
    Status addExperts(const std::string& name, const Matrix& m, uint32_t experts, uint32_t used) {
        auto data = std::make_unique<std::vector<float>>();
        data->reserve(m.v.size() * experts);
        for (uint32_t x = 0; x < experts; ++x) data->insert(data->end(), m.v.begin(), m.v.end());
        std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data->data()),
                                       data->size() * 4);
        params_after += m.cols * m.rows * used;
        owned.push_back(std::move(data));
        return w.addTensor(name, DType::F32, {int64_t(m.cols), int64_t(m.rows), int64_t(experts)},
                           bytes);
    }
    // The FFN of layer `out`: dense, or opt.experts copies of it behind a random router.
    Status feedForward(const std::string& out, Matrix gate, Matrix up, Matrix down) {
        if (opt.experts == 0) {
            BLUE_TRY(add(out + "ffn_gate.weight", std::move(gate)));
            BLUE_TRY(add(out + "ffn_up.weight", std::move(up)));
            return add(out + "ffn_down.weight", std::move(down));
        }
        // Router logits of about unit spread for inputs of unit RMS: top-k varies from token to
        // token.
        Matrix router(cfg.n_embd, opt.experts);
        for (float& x : router.v) x = gauss(1.0f / std::sqrt(float(cfg.n_embd)));
        BLUE_TRY(add(out + "ffn_gate_inp.weight", std::move(router)));
        BLUE_TRY(addExperts(out + "ffn_gate_exps.weight", gate, opt.experts, opt.experts_used));
        BLUE_TRY(addExperts(out + "ffn_up_exps.weight", up, opt.experts, opt.experts_used));
        return addExperts(out + "ffn_down_exps.weight", down, opt.experts, opt.experts_used);
    }
    Status copy(const std::string& name) {
        const GgufTensor* t = g.findTensor(name);
        if (!t) return BLUE_ERROR("%s: no tensor '%s'", g.name().c_str(), name.c_str());
        std::vector<int64_t> dims(t->ne.begin(), t->ne.begin() + t->n_dims);
        if (t->n_dims == 2 && name != "token_embd.weight") params_after += uint64_t(t->n_elements);
        return w.addTensor(name, t->type, dims, g.rawTensorData(*t));
    }
    // A layer: `src` is the original layer to widen, or -1 for a new one.
    Status layer(uint32_t out_index, int64_t src, uint32_t heads, uint32_t ffn) {
        const uint32_t dim = cfg.n_embd, hd = cfg.head_dim, f = opt.head_factor;
        const std::string in =
            "blk." + std::to_string(src < 0 ? cfg.n_layer - 1 : uint32_t(src)) + ".";
        const std::string out = "blk." + std::to_string(out_index) + ".";
        BLUE_TRY_ASSIGN(Matrix attn_norm, read(in + "attn_norm.weight"));
        BLUE_TRY_ASSIGN(Matrix ffn_norm, read(in + "ffn_norm.weight"));
        BLUE_TRY_ASSIGN(Matrix wq, read(in + "attn_q.weight"));
        BLUE_TRY_ASSIGN(Matrix wk, read(in + "attn_k.weight"));
        BLUE_TRY_ASSIGN(Matrix wv, read(in + "attn_v.weight"));
        BLUE_TRY_ASSIGN(Matrix wo, read(in + "attn_output.weight"));
        BLUE_TRY_ASSIGN(Matrix gate, read(in + "ffn_gate.weight"));
        BLUE_TRY_ASSIGN(Matrix up, read(in + "ffn_up.weight"));
        BLUE_TRY_ASSIGN(Matrix down, read(in + "ffn_down.weight"));
        const bool fresh = src < 0;
        // Query heads: the original head h sits at h * f, so it keeps its KV group; new heads
        // in between read with random queries and write through zero (or noise) columns.
        Matrix q(dim, uint64_t(heads) * hd), o(uint64_t(heads) * hd, dim);
        for (uint32_t h = 0; h < heads; ++h) {
            bool old = !fresh && h % f == 0;
            for (uint32_t i = 0; i < hd; ++i) {
                uint64_t row = uint64_t(h) * hd + i, old_row = uint64_t(h / f) * hd + i;
                for (uint32_t c = 0; c < dim; ++c)
                    q.at(row, c) = old ? wq.at(old_row, c) : gauss(0.05f);
                for (uint32_t r = 0; r < dim; ++r)
                    o.at(r, row) =
                        old ? wo.at(r, old_row) : (opt.noise > 0 ? gauss(opt.noise) : 0.0f);
            }
        }
        if (fresh) {
            for (float& x : wk.v) x = gauss(0.05f);
            for (float& x : wv.v) x = gauss(0.05f);
        }
        // FFN: new hidden units read with random gate/up rows and write through zero (or noise).
        Matrix g2(dim, ffn), u2(dim, ffn), d2(ffn, dim);
        for (uint32_t h = 0; h < ffn; ++h) {
            bool old = !fresh && h < cfg.n_ff;
            for (uint32_t c = 0; c < dim; ++c) {
                g2.at(h, c) = old ? gate.at(h, c) : gauss(0.05f);
                u2.at(h, c) = old ? up.at(h, c) : gauss(0.05f);
            }
            for (uint32_t r = 0; r < dim; ++r)
                d2.at(r, h) = old ? down.at(r, h) : (opt.noise > 0 ? gauss(opt.noise) : 0.0f);
        }
        BLUE_TRY(add(out + "attn_norm.weight", std::move(attn_norm), true));
        BLUE_TRY(add(out + "attn_q.weight", std::move(q)));
        BLUE_TRY(add(out + "attn_k.weight", std::move(wk)));
        BLUE_TRY(add(out + "attn_v.weight", std::move(wv)));
        BLUE_TRY(add(out + "attn_output.weight", std::move(o)));
        BLUE_TRY(add(out + "ffn_norm.weight", std::move(ffn_norm), true));
        return feedForward(out, std::move(g2), std::move(u2), std::move(d2));
    }
};

}  // namespace

Result<UpcycleReport> upcycleGguf(const std::string& in, const std::string& out,
                                  const UpcycleOptions& opt) {
    BLUE_TRY_ASSIGN(GgufFile g, ggufOpen(in));
    BLUE_TRY_ASSIGN(ModelConfig cfg, modelConfigFromGguf(g));
    if (cfg.arch != ModelArch::Llama)
        return BLUE_ERROR("%s: upcycling supports the llama architecture, not '%s'", in.c_str(),
                          cfg.arch_name.c_str());
    if (cfg.isMoe())
        return BLUE_ERROR("%s: the model already has experts; upcycling reads dense models",
                          in.c_str());
    if (cfg.has_rope_freqs)
        return BLUE_ERROR("%s: models with rope_freqs are not upcycled", in.c_str());
    if (opt.head_factor < 1 || opt.head_factor > 16)
        return BLUE_ERROR("head factor %u: must be 1 to 16", opt.head_factor);
    uint32_t ffn = opt.ffn ? opt.ffn : cfg.n_ff;
    if (ffn < cfg.n_ff) return BLUE_ERROR("FFN width %u is below the model's %u", ffn, cfg.n_ff);
    if (opt.extra_layers > 256) return BLUE_ERROR("%u extra layers: at most 256", opt.extra_layers);
    if (!(opt.noise >= 0.0f && opt.noise < 1.0f))
        return BLUE_ERROR("noise %g: must be in [0, 1)", double(opt.noise));
    if (opt.experts > kMaxExperts)
        return BLUE_ERROR("%u experts: at most %u", opt.experts, kMaxExperts);
    UpcycleOptions o = opt;
    if (o.experts && o.experts_used == 0) o.experts_used = std::min(2u, o.experts);
    if (o.experts && o.experts_used > o.experts)
        return BLUE_ERROR("%u experts used: must be 1 to the %u experts", o.experts_used,
                          o.experts);
    if (!o.experts) o.experts_used = 0;
    Builder b{g, cfg, o, {}, std::mt19937(opt.seed), {}, 0};
    const std::string arch = "llama.";
    for (const GgufKv& kv : g.kvs()) b.w.setValue(kv.key, kv.value);
    uint32_t heads = cfg.n_head * opt.head_factor, layers = cfg.n_layer + opt.extra_layers;
    b.w.setU32(arch + "block_count", layers);
    b.w.setU32(arch + "attention.head_count", heads);
    b.w.setU32(arch + "attention.head_count_kv", cfg.n_head_kv);
    b.w.setU32(arch + "attention.key_length", cfg.head_dim);
    b.w.setU32(arch + "attention.value_length", cfg.head_dim_v);
    b.w.setU32(arch + "feed_forward_length", ffn);
    b.w.setU32(arch + "rope.dimension_count", cfg.n_rot);
    if (o.experts) {
        b.w.setU32(arch + "expert_count", o.experts);
        b.w.setU32(arch + "expert_used_count", o.experts_used);
    }
    b.w.setString("general.name", "upcycled");
    BLUE_TRY(b.copy("token_embd.weight"));
    BLUE_TRY(b.copy("output_norm.weight"));
    if (!cfg.tied_output) BLUE_TRY(b.copy("output.weight"));
    for (uint32_t l = 0; l < layers; ++l)
        BLUE_TRY(b.layer(l, l < cfg.n_layer ? int64_t(l) : -1, heads, ffn));
    BLUE_TRY(b.w.write(out));
    UpcycleReport r;
    r.layers = layers;
    r.heads = heads;
    r.ffn = ffn;
    r.experts = o.experts;
    r.experts_used = o.experts_used;
    r.params_after = b.params_after;
    for (const GgufTensor& t : g.tensors()) {
        if (t.n_dims == 2 && t.name != "token_embd.weight")
            r.params_before += uint64_t(t.n_elements);
    }
    return r;
}

}  // namespace blue
