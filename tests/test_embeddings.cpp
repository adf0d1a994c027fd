// Embeddings end to end: the embed block and POOL against a plain C++ forward pass (on the GPU
// and the reference machine, across prefill chunks, beside generation on other instances), the
// pooling a model gets (its file's, an override, none) through the C API, and /v1/embeddings over
// HTTP: OpenAI's shapes, base64, dimensions, batches larger than the queue, errors, mutated bodies.
#include <doctest/doctest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "host/bluevm.h"
#include "host/server/embeddings.h"
#include "tests/generation_runs.h"
#include "tests/naive_forward.h"
#include "tests/server_fixture.h"
#include "tests/temp_dir.h"
#include "tools/synth/synth.h"
#include "vm/llm_request.h"

namespace blue::test {
namespace {

using json = nlohmann::json;

// A qwen2 model small enough for the naive pass (blue-synth's qwen2-yarn-tiny without YaRN), F32,
// with `<arch>.pooling_type` = `pooling_type` when it is not negative.
std::string writeQwen2(const TempDir& dir, int64_t pooling_type) {
    std::optional<SynthConfig> c = synthPreset("qwen2-yarn-tiny");
    REQUIRE(c.has_value());
    c->name = "qwen2-embed-tiny";
    c->yarn_factor = 0;
    c->orig_ctx = 0;
    GgufWriter w;
    REQUIRE(synthBuild(*c, SynthOptions{}, &w));
    if (pooling_type >= 0) w.setU32("qwen2.pooling_type", uint32_t(pooling_type));
    const std::string path = dir.path + "/qwen2_pool" + std::to_string(pooling_type) + ".gguf";
    REQUIRE(w.write(path));
    return path;
}

// The vectors the naive pass gives: the output-normed hidden states pooled as `p`.
std::vector<double> naivePooled(const GgufFile& g, const ModelConfig& cfg, const std::vector<uint32_t>& prompt,
                                Pooling p) {
    std::vector<std::vector<double>> h = naiveHidden(g, cfg, 96, prompt);
    if (p == Pooling::Cls) return h.front();
    if (p == Pooling::Last) return h.back();
    std::vector<double> mean(h[0].size(), 0.0);
    for (const std::vector<double>& row : h) {
        for (size_t i = 0; i < row.size(); ++i) mean[i] += row[i] / double(h.size());
    }
    return mean;
}

// max |got - want| / max |want|.
double relErr(const std::vector<float>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    double err = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::fabs(double(got[i]) - want[i]));
        scale = std::max(scale, std::fabs(want[i]));
    }
    return err / scale;
}

GenerationRequest embedRequest(uint32_t tag, std::vector<uint32_t> prompt) {
    GenerationRequest r;
    r.tag = tag;
    r.embed = true;
    r.prompt = std::move(prompt);
    return r;
}

// The largest elementwise difference of two vectors of one length (infinity for two lengths).
double maxDiff(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
    return d;
}

}  // namespace

// Prompts of 1, 5, 23 and 40 tokens in chunks of 16 (40 takes three prefill steps, so the mean
// folds chunks together and the first token's row comes from the first step), with a greedy
// generation request on the instances beside them; then, on one instance, the same prompt twice
// (last pooling reuses the KV rows of the first; mean and cls must recompute) and a generation
// after it.
TEST_CASE("embeddings: mean, cls and last pooling, on the GPU and the reference machine, equal a plain C++ forward pass") {
    TempDir dir("blue_embed");
    const std::string path = writeQwen2(dir, -1);
    auto g = ggufOpen(path);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    auto cfg = modelConfigFromGguf(g.value());
    REQUIRE_MESSAGE(cfg.isOk(), cfg.message());
    std::mt19937 rng(17);
    std::vector<std::vector<uint32_t>> prompts;
    for (uint32_t n : {1u, 5u, 23u, 40u}) {
        std::vector<uint32_t> p;
        for (uint32_t i = 0; i < n; ++i) p.push_back(3 + rng() % (cfg->n_vocab - 3));
        prompts.push_back(p);
    }
    for (Pooling pooling : {Pooling::Mean, Pooling::Cls, Pooling::Last}) {
        INFO("pooling " << std::string(poolingName(pooling)));
        LowerOptions lo;
        lo.ctx = 96;
        lo.kv_type = DType::F32;
        lo.grammar_words = 0;
        lo.max_rows = 64;
        lo.chunk = 16;
        lo.pooling = pooling;
        lo.model_path = path;
        auto m = lowerModel(g.value(), cfg.value(), lo);
        REQUIRE_MESSAGE(m.isOk(), m.message());
        CHECK(*m->metaValue(kMetaPooling) == poolingName(pooling));
        std::vector<GenerationRequest> reqs;
        for (uint32_t i = 0; i < prompts.size(); ++i) reqs.push_back(embedRequest(i, prompts[i]));
        GenerationRequest gen;
        gen.tag = 9;
        gen.prompt = prompts[2];
        gen.max_new = 6;
        gen.sampling.temperature = 0;
        reqs.insert(reqs.begin() + 2, gen);
        Generated ref = runOnRef(m.value(), 3, reqs);
        GpuGenerated gpu = runOnGpu(m.value(), 3, reqs);
        for (uint32_t i = 0; i < prompts.size(); ++i) {
            CAPTURE(i);
            const std::vector<double> want = naivePooled(g.value(), cfg.value(), prompts[i], pooling);
            CHECK(ref.tokens[i].empty());
            CHECK(gpu.out.tokens[i].empty());
            // Float sums of a few hundred terms per element over three layers, against doubles.
            CHECK(relErr(ref.logprobs[i], want) < 1e-4);
            CHECK(relErr(gpu.out.logprobs[i], want) < 1e-4);
        }
        CHECK(ref.tokens[9].size() == 6);
        CHECK(gpu.out.tokens[9] == ref.tokens[9]);
        CHECK(ref.logprobs.count(9) == 0);  // generation writes no float records without logprobs

        // One instance: the same prompt twice, then generation from its start.
        std::vector<GenerationRequest> again = {embedRequest(0, prompts[3]), embedRequest(1, prompts[3]), gen};
        again[2].tag = 2;
        GpuGenerated one = runOnGpu(m.value(), 1, again);
        CHECK(relErr(one.out.logprobs[1], naivePooled(g.value(), cfg.value(), prompts[3], pooling)) < 1e-4);
        CHECK(one.out.tokens[2] == ref.tokens[9]);
    }
}

TEST_CASE("embeddings: the file's pooling type is the default, an option overrides it, and without one an embedding is refused by name") {
    TempDir dir("blue_embed");
    auto open = [](const std::string& path, const char* pooling, bluevm_model** out) {
        bluevm_model_options mo;
        bluevm_model_options_init(&mo);
        mo.ctx = 96;
        mo.pooling = pooling;
        return bluevm_model_open(path.c_str(), &mo, out);
    };
    auto pooling = [](bluevm_model* m) {
        bluevm_model_info info;
        REQUIRE(bluevm_model_get_info(m, &info) == BLUEVM_OK);
        return std::string(info.pooling);
    };
    const std::string last = writeQwen2(dir, 3);
    bluevm_model* m = nullptr;
    REQUIRE_MESSAGE(open(last, nullptr, &m) == BLUEVM_OK, bluevm_last_error());
    CHECK(pooling(m) == "last");
    // Through an engine: the finished event carries n_embd floats; no tokens.
    bluevm_engine_options eo;
    bluevm_engine_options_init(&eo);
    eo.instances = 2;
    bluevm_engine* e = nullptr;
    REQUIRE_MESSAGE(bluevm_engine_create(m, &eo, &e) == BLUEVM_OK, bluevm_last_error());
    bluevm_request r;
    bluevm_request_init(&r);
    r.prompt = "hello world";
    r.embed = 1;
    uint64_t id = 0;
    REQUIRE_MESSAGE(bluevm_submit(e, &r, &id) == BLUEVM_OK, bluevm_last_error());
    bluevm_event ev{};
    do {
        REQUIRE(bluevm_poll(e, id, -1, &ev) == BLUEVM_OK);
    } while (!ev.finished);
    CHECK(ev.reason == BLUEVM_FINISH_STOP);
    CHECK(ev.n_tokens == 0);
    REQUIRE(ev.n_embedding == 256);
    double sq = 0;
    for (uint32_t i = 0; i < ev.n_embedding; ++i) sq += double(ev.embedding[i]) * ev.embedding[i];
    CHECK(sq > 1.0);  // the pooled state itself, not normalised
    bluevm_release(e, id);
    r.logprobs = 1;
    CHECK(bluevm_submit(e, &r, &id) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(std::string(bluevm_last_error()).find("an embedding takes no") != std::string::npos);
    bluevm_engine_destroy(e);
    bluevm_model_close(m);

    REQUIRE(open(last, "mean", &m) == BLUEVM_OK);
    CHECK(pooling(m) == "mean");
    bluevm_model_close(m);
    CHECK(open(last, "median", &m) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(std::string(bluevm_last_error()).find("pooling 'median'") != std::string::npos);

    // No pooling type: generation only, and an embedding says how to get one.
    REQUIRE(open(writeQwen2(dir, -1), nullptr, &m) == BLUEVM_OK);
    CHECK(pooling(m) == "none");
    REQUIRE(bluevm_engine_create(m, &eo, &e) == BLUEVM_OK);
    r.logprobs = 0;
    CHECK(bluevm_submit(e, &r, &id) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(std::string(bluevm_last_error()).find("qwen2.pooling_type") != std::string::npos);
    CHECK(std::string(bluevm_last_error()).find("--pooling") != std::string::npos);
    bluevm_engine_destroy(e);
    bluevm_model_close(m);
    // A reranker's (4) gives none; a value llama.cpp does not define is refused at load.
    REQUIRE(open(writeQwen2(dir, 4), nullptr, &m) == BLUEVM_OK);
    CHECK(pooling(m) == "none");
    bluevm_model_close(m);
    CHECK(open(writeQwen2(dir, 9), nullptr, &m) == BLUEVM_ERR_MODEL);
    CHECK(std::string(bluevm_last_error()).find("'qwen2.pooling_type': pooling type 9") != std::string::npos);
}

TEST_CASE("server: /v1/embeddings answers OpenAI's shape: unit vectors in input order, base64 of the same floats, dimensions cut and renormalise") {
    TestServer s(3, 256, 2, {}, {.pooling = "mean"});
    auto embed = [&](const json& body) { return postOk(s, "/v1/embeddings", body); };
    const std::vector<std::string> texts = {"Once upon a time", "The cat sat on the mat.", "Once upon a time"};
    json j = embed({{"input", texts}, {"model", "stories260K"}});
    CHECK(j["object"] == "list");
    CHECK(j["model"] == "stories260K");
    REQUIRE(j["data"].size() == 3);
    std::vector<std::vector<float>> v;
    for (size_t i = 0; i < 3; ++i) {
        CHECK(j["data"][i]["object"] == "embedding");
        CHECK(j["data"][i]["index"] == i);
        v.push_back(j["data"][i]["embedding"].get<std::vector<float>>());
        REQUIRE(v[i].size() == 64);
        double sq = 0;
        for (float x : v[i]) sq += double(x) * x;
        CHECK(std::fabs(sq - 1.0) < 1e-5);
    }
    // Same text, same vector, up to the summation order: on a GPU the batch's shape picks the
    // matmul kernel (one item, a 4-item tile or the tiled GEMM), each summing in its own order
    // (an NVIDIA H100 differed by 1.0e-5 in the largest element).
    CHECK(maxDiff(v[0], v[2]) < 1e-4);
    double dot = 0;
    for (size_t i = 0; i < 64; ++i) dot += double(v[0][i]) * v[1][i];
    CHECK(dot < 0.999);
    // usage: the prompt tokens as the model's tokenizer counts them (BOS included).
    size_t tokens = 0;
    for (const std::string& t : texts) {
        auto tok = post(s, "/tokenize", {{"content", t}, {"add_special", true}});
        REQUIRE(tok);
        tokens += json::parse(tok->body)["tokens"].size();
    }
    CHECK(j["usage"]["prompt_tokens"] == tokens);
    CHECK(j["usage"]["total_tokens"] == tokens);

    // A string alone, and the same text as token ids, give that vector: the same floats for the
    // same request shape, within the summation order's error in another batch.
    const std::vector<float> alone = embed({{"input", texts[0]}})["data"][0]["embedding"];
    CHECK(maxDiff(alone, v[0]) < 1e-4);
    auto ids = json::parse(post(s, "/tokenize", {{"content", texts[0]}, {"add_special", true}})->body)["tokens"];
    CHECK(embed({{"input", ids}})["data"][0]["embedding"].get<std::vector<float>>() == alone);
    CHECK(maxDiff(embed({{"input", json::array({ids, ids})}})["data"][1]["embedding"].get<std::vector<float>>(), v[0]) < 1e-4);

    // base64: the little-endian bytes of the same floats.
    const std::vector<float> second = embed({{"input", texts[1]}})["data"][0]["embedding"];
    std::string b64 = embed({{"input", texts[1]}, {"encoding_format", "base64"}})["data"][0]["embedding"];
    CHECK(b64 == server::base64Floats(second));
    CHECK(server::base64Floats({1.0f}) == "AACAPw==");  // 00 00 80 3f
    CHECK(server::base64Floats({1.0f, -2.0f}) == "AACAPwAAAMA=");

    // dimensions: the first N elements, unit length again.
    std::vector<float> cut = embed({{"input", texts[1]}, {"dimensions", 16}})["data"][0]["embedding"];
    REQUIRE(cut.size() == 16);
    double sq = 0;
    for (size_t i = 0; i < 16; ++i) sq += double(second[i]) * second[i];
    for (size_t i = 0; i < 16; ++i) CHECK(std::fabs(cut[i] - second[i] / std::sqrt(sq)) < 1e-6);

    // 40 inputs with room for 2 waiting requests: the handler waits for its own to make room.
    std::vector<std::string> many;
    for (int i = 0; i < 40; ++i) many.push_back(i % 2 ? texts[1] : "Lily had a red ball number " + std::to_string(i));
    json big = embed({{"input", many}});
    REQUIRE(big["data"].size() == 40);
    for (int i = 1; i < 40; i += 2) CHECK(maxDiff(big["data"][i]["embedding"].get<std::vector<float>>(), v[1]) < 1e-4);
    CHECK(s.metric("bluevm_requests_finished_total") >= 47);
}

TEST_CASE("server: /v1/embeddings errors name the field; a model without pooling says how to get one") {
    {
        TestServer s(1, 64, 4, {}, {.pooling = "last"});
        auto expect = [&](const json& body, int status, const std::string& param, const std::string& text) {
            auto res = post(s, "/v1/embeddings", body);
            REQUIRE(res);
            INFO(res->body);
            CHECK(res->status == status);
            json e = json::parse(res->body)["error"];
            CHECK(e["param"] == param);
            CHECK(e["message"].get<std::string>().find(text) != std::string::npos);
        };
        expect(json::object(), 400, "input", "'input' is required");
        expect({{"input", ""}}, 400, "input", "'input' is empty");
        expect({{"input", json::array()}}, 400, "input", "empty array");
        expect({{"input", {"a", 3}}}, 400, "input", "'input[1]' must be a string");
        expect({{"input", {1, 99999}}}, 400, "input", "'input[1]' (99999) is not a token id");
        expect({{"input", {json::array({1}), json::array()}}}, 400, "input", "'input[1]' is empty");
        expect({{"input", "a"}, {"encoding_format", "int8"}}, 400, "encoding_format", "\"float\" or \"base64\"");
        expect({{"input", "a"}, {"dimensions", 65}}, 400, "dimensions", "from 1 to 64");
        expect({{"input", "a"}, {"dimensions", 0}}, 400, "dimensions", "from 1 to 64");
        expect({{"input", "a"}, {"model", "gpt-4"}}, 404, "model", "does not exist");
        expect({{"input", std::string(400, 'x')}}, 400, "input", "the context holds 64");
        // The server still answers.
        auto res = post(s, "/v1/embeddings", {{"input", "a"}});
        REQUIRE(res);
        CHECK(res->status == 200);
    }
    TestServer plain(1, 64, 4);
    auto res = post(plain, "/v1/embeddings", {{"input", "Once upon a time"}});
    REQUIRE(res);
    CHECK(res->status == 400);
    const std::string message = json::parse(res->body)["error"]["message"];
    CHECK(message.find("no pooling type") != std::string::npos);
    CHECK(message.find("--pooling mean|cls|last") != std::string::npos);
}

// Bodies made from valid ones by replacing values with every JSON type, changing bytes and
// cutting them short: each parses or gets a 4xx with a message, never an exception.
TEST_CASE("server: mutated /v1/embeddings bodies parse or fail with a 4xx message, never throw") {
    const std::vector<json> seeds = {
        {{"input", "Once upon a time"}, {"model", "m"}},
        {{"input", {"a", "b c"}}, {"encoding_format", "base64"}, {"dimensions", 8}},
        {{"input", {{1, 2, 3}, {4}}}, {"user", "u"}},
    };
    const std::vector<json> values = {nullptr, true, 0, -1, 1, 65, 1e300, 0.5, "", "x", json::array(),
                                      json::array({1, "a", nullptr}), json::array({json::array()}),
                                      json::object(), 18446744073709551615ull, std::string(300, 'z')};
    const std::vector<std::string> keys = {"input", "encoding_format", "dimensions", "model", "user"};
    std::mt19937 rng(99);
    size_t accepted = 0;
    for (int i = 0; i < 20000; ++i) {
        json j = seeds[rng() % seeds.size()];
        std::string body;
        switch (rng() % 3) {
            case 0:
                j[keys[rng() % keys.size()]] = values[rng() % values.size()];
                if (j["input"].is_array() && !j["input"].empty() && rng() % 2) j["input"][0] = values[rng() % values.size()];
                body = j.dump();
                break;
            case 1:
                body = j.dump();
                for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) body[rng() % body.size()] = char(rng() % 256);
                break;
            default:
                body = j.dump();
                body.resize(rng() % (body.size() + 1));
        }
        server::EmbeddingRequest r;
        std::optional<server::ApiError> e;
        REQUIRE_NOTHROW(e = server::parseEmbeddingRequest(body, 64, 512, &r));
        if (e) {
            CHECK(e->status == 400);
            CHECK(!e->message.empty());
        } else {
            ++accepted;
            CHECK(!r.inputs.empty());
            for (const auto& in : r.inputs) CHECK((in.is_ids ? !in.ids.empty() : !in.text.empty()));
            CHECK(r.dimensions <= 64);
        }
    }
    CHECK(accepted > 100);
}

}  // namespace blue::test
