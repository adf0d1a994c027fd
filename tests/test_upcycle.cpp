// Tests of upcycling into experts (compiler/upcycle.h, UpcycleOptions::experts) without a GPU:
// stories260K becomes a Mixtral-style MoE that modelConfigFromGguf accepts, keeps its tokenizer,
// holds the dense FFN in every expert, routes tokens to varying experts, and whose MoE FFN
// (softmax, top-k, renormalised, computed here on the CPU) equals the dense FFN. The widening and
// deepening paths are tested end to end on the GPU in test_cascade_spec.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "compiler/gguf.h"
#include "compiler/model_config.h"
#include "compiler/upcycle.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"

namespace blue {
namespace {

std::string stories() {
    return test::sharedDir() + "/models/stories260K/stories260K.gguf";
}

std::vector<float> floats(const GgufFile& f, const std::string& name) {
    const GgufTensor* t = f.findTensor(name);
    REQUIRE_MESSAGE(t, name);
    REQUIRE(t->type == DType::F32);
    std::span<const uint8_t> bytes = f.rawTensorData(*t);
    std::vector<float> v(size_t(t->n_elements));
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
    return v;
}

// y[r] = sum_c w[r * cols + c] * x[c] over `rows` rows starting at `w`.
std::vector<float> matVec(const float* w, size_t rows, const std::vector<float>& x) {
    std::vector<float> y(rows);
    for (size_t r = 0; r < rows; ++r) {
        double acc = 0;
        for (size_t c = 0; c < x.size(); ++c) acc += double(w[r * x.size() + c]) * x[c];
        y[r] = float(acc);
    }
    return y;
}

// SwiGLU FFN: down(silu(gate x) * up x), with gate/up of n_ff rows and down of n_embd rows.
std::vector<float> ffn(const float* gate, const float* up, const float* down, size_t n_ff,
                       const std::vector<float>& x) {
    std::vector<float> g = matVec(gate, n_ff, x), u = matVec(up, n_ff, x);
    for (size_t i = 0; i < n_ff; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    std::vector<float> y(x.size());
    for (size_t r = 0; r < x.size(); ++r) {
        double acc = 0;
        for (size_t i = 0; i < n_ff; ++i) acc += double(down[r * n_ff + i]) * g[i];
        y[r] = float(acc);
    }
    return y;
}

struct MoeLayer {
    std::vector<float> router, gate, up, down;  // [n_embd, E], [n_embd, f, E] x2, [f, n_embd, E]
};

// Mixtral's FFN: softmax over the router logits, the top k, renormalised, weighting the experts.
// `picked` receives the chosen experts.
std::vector<float> moeFfn(const MoeLayer& m, const ModelConfig& c, const std::vector<float>& x,
                          std::vector<uint32_t>* picked) {
    std::vector<float> logits = matVec(m.router.data(), c.n_expert, x);
    std::vector<uint32_t> order(c.n_expert);
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + c.n_expert_used, order.end(),
                      [&](uint32_t a, uint32_t b) { return logits[a] > logits[b]; });
    order.resize(c.n_expert_used);
    // Softmax then renormalising over the top k is a softmax over the top k alone.
    double sum = 0;
    for (uint32_t e : order) sum += std::exp(double(logits[e] - logits[order[0]]));
    std::vector<float> y(x.size(), 0.0f);
    const size_t f = c.n_ff_exp, n = c.n_embd;
    for (uint32_t e : order) {
        float w = float(std::exp(double(logits[e] - logits[order[0]])) / sum);
        std::vector<float> ye = ffn(m.gate.data() + e * f * n, m.up.data() + e * f * n,
                                    m.down.data() + e * f * n, f, x);
        for (size_t i = 0; i < n; ++i) y[i] += w * ye[i];
    }
    *picked = order;
    return y;
}

}  // namespace

TEST_CASE("upcycle: stories260K into 8 experts, top-2, computes the dense FFN") {
    test::TempDir dir("blue_upcycle");
    const std::string moe_path = dir.path + "/moe.gguf";
    UpcycleOptions uo;
    uo.experts = 8;
    uo.experts_used = 2;
    uo.seed = 7;
    Result<UpcycleReport> r = upcycleGguf(stories(), moe_path, uo);
    REQUIRE_MESSAGE(r, r.message());
    CHECK(r->experts == 8);
    CHECK(r->experts_used == 2);
    CHECK(r->layers == 5);

    Result<GgufFile> dense = ggufOpen(stories()), moe = ggufOpen(moe_path);
    REQUIRE(dense);
    REQUIRE(moe);
    Result<ModelConfig> dc = modelConfigFromGguf(*dense), mc = modelConfigFromGguf(*moe);
    REQUIRE_MESSAGE(mc, mc.message());
    CHECK(mc->arch == ModelArch::Llama);
    CHECK(mc->n_expert == 8);
    CHECK(mc->n_expert_used == 2);
    CHECK(mc->n_ff_exp == dc->n_ff);
    CHECK(mc->expert_weights_norm);
    CHECK(mc->n_layer == dc->n_layer);
    CHECK(moe->getU32("llama.expert_count").value() == 8);
    CHECK(moe->getU32("llama.expert_used_count").value() == 2);
    CHECK(moe->findTensor("blk.0.ffn_gate.weight") == nullptr);
    // The tokenizer and the other metadata are kept.
    for (const GgufKv& kv : dense->kvs()) {
        if (kv.key == "general.name") continue;
        CAPTURE(kv.key);
        const GgufValue* v = moe->find(kv.key);
        REQUIRE(v);
        CHECK(v->toDisplay() == kv.value.toDisplay());
    }

    const size_t n = dc->n_embd, f = dc->n_ff;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::set<std::vector<uint32_t>> choices;
    for (uint32_t l = 0; l < dc->n_layer; ++l) {
        CAPTURE(l);
        auto name = [l](const char* s) { return "blk." + std::to_string(l) + "." + s; };
        std::vector<float> gate = floats(*dense, name("ffn_gate.weight"));
        std::vector<float> up = floats(*dense, name("ffn_up.weight"));
        std::vector<float> down = floats(*dense, name("ffn_down.weight"));
        MoeLayer m{
            floats(*moe, name("ffn_gate_inp.weight")), floats(*moe, name("ffn_gate_exps.weight")),
            floats(*moe, name("ffn_up_exps.weight")), floats(*moe, name("ffn_down_exps.weight"))};
        REQUIRE(m.gate.size() == 8 * f * n);
        // Every expert is the dense FFN, bit for bit.
        for (size_t e = 0; e < 8; ++e) {
            CHECK(std::equal(gate.begin(), gate.end(), m.gate.begin() + e * f * n));
            CHECK(std::equal(up.begin(), up.end(), m.up.begin() + e * f * n));
            CHECK(std::equal(down.begin(), down.end(), m.down.begin() + e * f * n));
        }
        for (int t = 0; t < 16; ++t) {
            std::vector<float> x(n);
            for (float& v : x) v = normal(rng);
            std::vector<uint32_t> picked;
            std::vector<float> want = ffn(gate.data(), up.data(), down.data(), f, x);
            std::vector<float> got = moeFfn(m, *mc, x, &picked);
            std::sort(picked.begin(), picked.end());
            choices.insert(picked);
            double err = 0, norm = 0;
            for (size_t i = 0; i < n; ++i) {
                err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
                norm += double(want[i]) * want[i];
            }
            CHECK(std::sqrt(err / norm) < 1e-5);
        }
    }
    // The random router spreads tokens over many of the 28 pairs.
    CHECK(choices.size() >= 10);
}

TEST_CASE("upcycle: experts combine with widening and deepening; bad counts are refused") {
    test::TempDir dir("blue_upcycle");
    UpcycleOptions uo;
    uo.experts = 4;  // experts_used defaults to 2
    uo.ffn = 256;
    uo.extra_layers = 1;
    const std::string path = dir.path + "/moe.gguf";
    Result<UpcycleReport> r = upcycleGguf(stories(), path, uo);
    REQUIRE_MESSAGE(r, r.message());
    CHECK(r->experts_used == 2);
    Result<GgufFile> g = ggufOpen(path);
    REQUIRE(g);
    Result<ModelConfig> c = modelConfigFromGguf(*g);
    REQUIRE_MESSAGE(c, c.message());
    CHECK(c->n_layer == 6);
    CHECK(c->n_ff_exp == 256);
    CHECK(g->findTensor("blk.5.ffn_down_exps.weight")->ne[2] == 4);
    CHECK(g->findTensor("blk.5.ffn_down_exps.weight")->ne[0] == 256);

    auto error = [&](const std::string& in, UpcycleOptions o) {
        Result<UpcycleReport> bad = upcycleGguf(in, dir.path + "/bad.gguf", o);
        REQUIRE_FALSE(bad);
        return bad.message();
    };
    UpcycleOptions o;
    o.experts = 4;
    o.experts_used = 5;
    CHECK(error(stories(), o).find("5 experts used") != std::string::npos);
    o.experts = 300;
    o.experts_used = 2;
    CHECK(error(stories(), o).find("300 experts: at most 256") != std::string::npos);
    CHECK(error(path, UpcycleOptions{}).find("already has experts") != std::string::npos);
}

}  // namespace blue
