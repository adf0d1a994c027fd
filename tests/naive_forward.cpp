// The naive forward pass of gemma2, gemma3, phi3 and qwen2 (see naive_forward.h).
#include "tests/naive_forward.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace blue::test {
namespace {

using Vec = std::vector<double>;

struct Weights {
    const GgufFile& file;
    std::vector<float> get(const std::string& name) const {
        const GgufTensor* t = file.findTensor(name);
        REQUIRE_MESSAGE(t, name);
        REQUIRE(t->type == DType::F32);
        std::span<const uint8_t> data = file.rawTensorData(*t);
        std::vector<float> out(size_t(t->n_elements));
        std::memcpy(out.data(), data.data(), out.size() * 4);
        return out;
    }
    std::vector<float> layer(uint32_t l, const char* name) const {
        return get("blk." + std::to_string(l) + "." + name);
    }
};

// y[n] = sum_k w[(row0 + n) * K + k] x[k] for n < rows.
Vec matvec(const std::vector<float>& w, const Vec& x, size_t row0, size_t rows) {
    Vec y(rows, 0.0);
    for (size_t n = 0; n < rows; ++n) {
        for (size_t k = 0; k < x.size(); ++k) y[n] += double(w[(row0 + n) * x.size() + k]) * x[k];
    }
    return y;
}

// RMSNorm of each group of `group` values, times w.
Vec rmsNorm(const Vec& x, const std::vector<float>& w, double eps, size_t group) {
    Vec y(x.size());
    for (size_t g = 0; g < x.size(); g += group) {
        double ss = 0;
        for (size_t i = 0; i < group; ++i) ss += x[g + i] * x[g + i];
        double s = 1.0 / std::sqrt(ss / double(group) + eps);
        for (size_t i = 0; i < group; ++i) y[g + i] = x[g + i] * s * w[i];
    }
    return y;
}

// YaRN's blend weight of pair i (ggml_rope_yarn_corr_dims and rope_yarn_ramp): 1 for pairs that
// turn more than beta_fast times in the original context, 0 below beta_slow turns, linear between.
double yarnRamp(const ModelConfig& c, uint32_t i) {
    auto corr = [&](double turns) {
        return c.n_rot * std::log(c.rope_scaling_orig_ctx / (turns * 2 * M_PI)) / (2 * std::log(double(c.rope_freq_base)));
    };
    double lo = std::max(0.0, std::floor(corr(c.yarn_beta_fast)));
    double hi = std::min(double(c.n_rot - 1), std::ceil(corr(c.yarn_beta_slow)));
    double y = (i - lo) / std::max(0.001, hi - lo);
    return 1.0 - std::min(1.0, std::max(0.0, y));
}

// NeoX RoPE of every head of v at position pos (ggml_rope_ext: the rotation scaled by
// attn_factor, dims past n_rot unchanged). yarn: the angle blends the extrapolated angle and the
// interpolated one (divided by the factor) by the ramp times ext_factor, and the magnitude grows
// by yarn_attn_factor (1 + 0.1 ln factor).
void rope(Vec& v, const ModelConfig& c, double pos, double base, double freq_scale,
          const std::vector<float>* factors, double attn_factor, bool yarn = false) {
    const uint32_t hd = c.head_dim, half = c.n_rot / 2;
    double mag = attn_factor;
    if (c.rope_scaling == RopeScaling::Yarn) mag *= c.yarn_attn_factor;  // on gemma3's local layers too
    if (yarn && c.yarn_ext_factor != 0) mag *= 1 + 0.1 * std::log(c.rope_scaling_factor);
    for (size_t h = 0; h < v.size(); h += hd) {
        for (uint32_t i = 0; i < half; ++i) {
            double theta = pos * freq_scale * std::pow(base, -2.0 * i / c.n_rot) /
                           (factors ? (*factors)[i] : 1.0f);
            if (yarn) {
                double extrap = pos * std::pow(base, -2.0 * i / c.n_rot), interp = extrap / c.rope_scaling_factor;
                double mix = yarnRamp(c, i) * c.yarn_ext_factor;
                theta = interp * (1 - mix) + extrap * mix;
            }
            double x0 = v[h + i], x1 = v[h + i + half];
            v[h + i] = (x0 * std::cos(theta) - x1 * std::sin(theta)) * mag;
            v[h + i + half] = (x0 * std::sin(theta) + x1 * std::cos(theta)) * mag;
        }
    }
}

}  // namespace

std::vector<std::vector<double>> naiveHidden(const GgufFile& file, const ModelConfig& c, uint32_t ctx,
                                             const std::vector<uint32_t>& tokens) {
    const Weights w{file};
    const bool gemma = c.arch == ModelArch::Gemma2 || c.arch == ModelArch::Gemma3;
    const bool phi3 = c.arch == ModelArch::Phi3;
    REQUIRE((gemma || phi3 || c.arch == ModelArch::Qwen2));
    const bool yarn = c.rope_scaling == RopeScaling::Yarn;
    const size_t T = tokens.size(), E = c.n_embd, hd = c.head_dim;
    const size_t qd = size_t(c.n_head) * hd, kvd = size_t(c.n_head_kv) * hd, F = c.n_ff;
    const double eps = c.rms_norm_eps;
    const std::vector<float> embd = w.get("token_embd.weight");
    std::vector<Vec> x(T);
    for (size_t t = 0; t < T; ++t) {
        x[t].assign(embd.begin() + tokens[t] * E, embd.begin() + (tokens[t] + 1) * E);
        if (gemma) {
            for (double& v : x[t]) v *= double(std::sqrt(float(E)));
        }
    }
    std::vector<float> factors;
    if (phi3 && (ctx > c.rope_scaling_orig_ctx ? c.has_rope_long : c.has_rope_short)) {
        factors = w.get(ctx > c.rope_scaling_orig_ctx ? "rope_factors_long.weight"
                                                      : "rope_factors_short.weight");
    }
    for (uint32_t l = 0; l < c.n_layer; ++l) {
        // gemma2: even layers slide; gemma3: five of every six, with RoPE base 10000 unscaled
        // there.
        const bool sliding = (c.arch == ModelArch::Gemma2 && l % 2 == 0) ||
                             (c.arch == ModelArch::Gemma3 && l % 6 < 5);
        double base = c.rope_freq_base,
               fscale = c.rope_scaling == RopeScaling::Linear ? 1.0 / c.rope_scaling_factor : 1.0;
        if (c.arch == ModelArch::Gemma3 && sliding) base = 10000.0, fscale = 1.0;
        std::vector<Vec> q(T), k(T), v(T);
        const std::vector<float> norm = w.layer(l, "attn_norm.weight");
        const std::vector<float> wqkv = phi3 ? w.layer(l, "attn_qkv.weight") : std::vector<float>();
        const std::vector<float> wq = phi3 ? wqkv : w.layer(l, "attn_q.weight");
        const std::vector<float> wk = phi3 ? wqkv : w.layer(l, "attn_k.weight");
        const std::vector<float> wv = phi3 ? wqkv : w.layer(l, "attn_v.weight");
        for (size_t t = 0; t < T; ++t) {
            Vec h = rmsNorm(x[t], norm, eps, E);
            q[t] = matvec(wq, h, 0, qd);
            k[t] = matvec(wk, h, phi3 ? qd : 0, kvd);
            v[t] = matvec(wv, h, phi3 ? qd + kvd : 0, kvd);
            if (c.has_qkv_bias) {
                const std::vector<float> bq = w.layer(l, "attn_q.bias"), bk = w.layer(l, "attn_k.bias"),
                                         bv = w.layer(l, "attn_v.bias");
                for (size_t i = 0; i < qd; ++i) q[t][i] += bq[i];
                for (size_t i = 0; i < kvd; ++i) k[t][i] += bk[i], v[t][i] += bv[i];
            }
            if (c.arch == ModelArch::Gemma3) {
                q[t] = rmsNorm(q[t], w.layer(l, "attn_q_norm.weight"), eps, hd);
                k[t] = rmsNorm(k[t], w.layer(l, "attn_k_norm.weight"), eps, hd);
            }
            const bool yarn_layer = yarn && !(c.arch == ModelArch::Gemma3 && sliding);
            rope(q[t], c, double(t), base, fscale, factors.empty() ? nullptr : &factors,
                 c.rope_attn_factor, yarn_layer);
            rope(k[t], c, double(t), base, fscale, factors.empty() ? nullptr : &factors,
                 c.rope_attn_factor, yarn_layer);
            for (double& e : q[t]) e /= std::sqrt(double(hd));
        }
        const std::vector<float> wo = w.layer(l, "attn_output.weight");
        for (size_t t = 0; t < T; ++t) {  // q, k, v of every position are already computed
            Vec att(qd, 0.0);
            for (size_t h = 0; h < c.n_head; ++h) {
                const size_t kvh = h / (c.n_head / c.n_head_kv);
                Vec s(t + 1, -INFINITY);
                double m = -INFINITY;
                for (size_t u = 0; u <= t; ++u) {
                    if (sliding && t - u >= c.sliding_window) continue;
                    double d = 0;
                    for (size_t i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[u][kvh * hd + i];
                    if (c.arch == ModelArch::Gemma2)
                        d = c.attn_softcap * std::tanh(d / c.attn_softcap);
                    s[u] = d;
                    m = std::max(m, d);
                }
                double z = 0;
                for (double& e : s) z += (e = std::exp(e - m));
                for (size_t u = 0; u <= t; ++u) {
                    for (size_t i = 0; i < hd; ++i)
                        att[h * hd + i] += s[u] / z * v[u][kvh * hd + i];
                }
            }
            Vec o = matvec(wo, att, 0, E);
            if (gemma) o = rmsNorm(o, w.layer(l, "post_attention_norm.weight"), eps, E);
            for (size_t i = 0; i < E; ++i) x[t][i] += o[i];
        }
        const std::vector<float> ffn_norm = w.layer(l, "ffn_norm.weight"),
                                 down = w.layer(l, "ffn_down.weight");
        const std::vector<float> up = w.layer(l, "ffn_up.weight");
        const std::vector<float> gate = phi3 ? up : w.layer(l, "ffn_gate.weight");
        for (size_t t = 0; t < T; ++t) {
            Vec h = rmsNorm(x[t], ffn_norm, eps, E);
            Vec g = matvec(gate, h, 0, F), u = matvec(up, h, phi3 ? F : 0, F);
            for (size_t i = 0; i < F; ++i) {
                double a = gemma ? 0.5 * g[i] *
                                       (1.0 + std::tanh(std::sqrt(2.0 / M_PI) *
                                                        (g[i] + 0.044715 * g[i] * g[i] * g[i])))
                                 : g[i] / (1.0 + std::exp(-g[i]));
                g[i] = a * u[i];
            }
            Vec d = matvec(down, g, 0, E);
            if (gemma) d = rmsNorm(d, w.layer(l, "post_ffw_norm.weight"), eps, E);
            for (size_t i = 0; i < E; ++i) x[t][i] += d[i];
        }
    }
    const std::vector<float> out_norm = w.get("output_norm.weight");
    for (size_t t = 0; t < T; ++t) x[t] = rmsNorm(x[t], out_norm, eps, E);
    return x;
}

std::vector<std::vector<double>> naiveLogProbs(const GgufFile& file, const ModelConfig& c,
                                               uint32_t ctx, const std::vector<uint32_t>& tokens) {
    const Weights w{file};
    const std::vector<float> head = w.get(c.tied_output ? "token_embd.weight" : "output.weight");
    const std::vector<Vec> hidden = naiveHidden(file, c, ctx, tokens);
    std::vector<Vec> out(hidden.size());
    for (size_t t = 0; t < hidden.size(); ++t) {
        Vec logits = matvec(head, hidden[t], 0, c.n_vocab);
        if (c.arch == ModelArch::Gemma2) {
            for (double& e : logits) e = c.final_softcap * std::tanh(e / c.final_softcap);
        }
        double m = *std::max_element(logits.begin(), logits.end()), z = 0;
        for (double e : logits) z += std::exp(e - m);
        for (double& e : logits) e -= m + std::log(z);
        out[t] = std::move(logits);
    }
    return out;
}

}  // namespace blue::test
