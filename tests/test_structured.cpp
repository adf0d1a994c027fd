// Structured output end to end with the real stories260K model: grammars and JSON schemas compiled
// on the host (host/llm/structured_output.h) and applied by SAMPLEG on the GPU.
//   - the GPU's SAMPLEG gives the reference machine's tokens (greedy; sampled: the first 8, as
//     float rounding may move a later draw across a boundary), request for request, with instances
//     under different grammars (and one under none) batched together, greedy and sampled, with
//     short prompts and prompts of several prefill chunks (whose earlier samples must not move
//     the automaton: the text starts at its start state);
//   - what the model writes follows the grammar: the text of every request that ended by itself
//     is a sentence of its automaton, and JSON parses and satisfies its schema;
//   - an automaton no token can continue ends the request at once (the end-of-generation token
//     is forced);
//   - through the Engine (the C++ API users call): 200 random schemas (nested objects, arrays,
//     enums with escapes, numbers, integers with bounds, strings with lengths) sampled at
//     temperature 1 on 16 instances, every output valid against its schema;
//   - a grammar larger than an instance holds is refused with the sizes named.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <random>

#include "compiler/gguf.h"
#include "compiler/grammar/dfa.h"
#include "compiler/grammar/gbnf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "compiler/tokenizer.h"
#include "host/llm/engine.h"
#include "host/llm/structured_output.h"
#include "tests/generation_runs.h"
#include "tests/gpu_fixture.h"
#include "tests/schema_check.h"
#include "tests/test_paths.h"
#include "vm/llm_abi.h"

namespace blue::test {
namespace {

std::string storiesPath() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }

struct Lowered {
    GgufFile gguf;
    Tokenizer tok;
    Module module;
};

Lowered loweredStories(uint32_t ctx) {
    auto g = ggufOpen(storiesPath());
    REQUIRE_MESSAGE(g.isOk(), g.message());
    auto cfg = modelConfigFromGguf(g.value());
    REQUIRE_MESSAGE(cfg.isOk(), cfg.message());
    auto tok = Tokenizer::fromGguf(g.value());
    REQUIRE_MESSAGE(tok.isOk(), tok.message());
    LowerOptions opt;
    opt.ctx = ctx;
    opt.model_path = storiesPath();
    auto m = lowerModel(g.value(), cfg.value(), opt);
    REQUIRE_MESSAGE(m.isOk(), m.message());
    return {std::move(g.value()), std::move(tok.value()), std::move(m.value())};
}

PackedGrammar compiled(ConstraintKind kind, const std::string& text) {
    auto g = compileConstraint({kind, text}, kDefaultGrammarWords);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    return g.value();
}

ByteDfa dfaOf(const std::string& gbnf) {
    auto g = parseGbnf(gbnf);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    auto d = buildDfa(g.value());
    REQUIRE_MESSAGE(d.isOk(), d.message());
    return std::move(d.value());
}

// The text of generated tokens as a server streams it after a prompt: the pieces back to back.
std::string textOf(const Tokenizer& tok, const std::vector<uint32_t>& ids) {
    std::string s;
    for (uint32_t t : ids) s += tok.piece(int32_t(t));
    return s;
}

const char* kSentence = R"(root ::= "Once upon a time, " [a-z ]{4,30} "." )";
const char* kPerson = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish \"Bob\""]}, "maxItems": 3}},
    "required": ["name", "age", "pets"]})";

TEST_CASE("structured: SAMPLEG on the GPU gives the reference machine's tokens, and the text follows the grammar") {
    Lowered s = loweredStories(448);
    std::string story;  // a prompt of several prefill chunks (128 tokens each): their samples
    for (int k = 0; k < 14; ++k) story += "Once upon a time there was a little girl. ";  // are not the text's
    const PackedGrammar sentence = compiled(ConstraintKind::Grammar, kSentence);
    const PackedGrammar object = compiled(ConstraintKind::JsonObject, "");
    const PackedGrammar person = compiled(ConstraintKind::JsonSchema, kPerson);
    std::vector<GenerationRequest> reqs;
    const PackedGrammar grammars[] = {sentence, object, person, nullptr};
    for (uint32_t i = 0; i < 8; ++i) {
        GenerationRequest r;
        r.tag = i;
        r.max_new = 100;
        r.grammar = grammars[i % 4];
        r.sampling.temperature = i < 4 ? 0.0f : 0.9f;
        r.sampling.seed = 11 + i;
        r.prompt = s.tok.promptIds(i >= 5 ? story : i % 2 ? "Lily said" : "");
        reqs.push_back(r);
    }
    Generated ref = runOnRef(s.module, 3, reqs);
    GpuGenerated gpu = runOnGpu(s.module, 3, reqs);
    const ByteDfa sentence_dfa = dfaOf(kSentence);
    const nlohmann::json person_schema = nlohmann::json::parse(kPerson);
    uint32_t ended = 0;
    for (const GenerationRequest& r : reqs) {
        CAPTURE(r.tag);
        const std::vector<uint32_t>& tokens = gpu.out.tokens[r.tag];
        if (r.sampling.temperature == 0) {
            CHECK(tokens == ref.tokens[r.tag]);
        } else {
            // Sampled over a long context, a draw may fall on the other side of a boundary that
            // the machines' float roundings put apart (as in the per-op SAMPLE case): the first
            // tokens agree.
            const size_t n = std::min<size_t>(8, tokens.size());
            REQUIRE(ref.tokens[r.tag].size() >= n);
            CHECK(std::equal(tokens.begin(), tokens.begin() + n, ref.tokens[r.tag].begin()));
        }
        if (!r.grammar || tokens.size() >= r.max_new) continue;
        ++ended;
        const std::string text = textOf(s.tok, tokens);
        CAPTURE(text);
        if (r.grammar == sentence) {
            CHECK(dfaAccepts(sentence_dfa, text));
            continue;
        }
        nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
        REQUIRE(!j.is_discarded());
        CHECK(j.is_object());
        if (r.grammar == person) CHECK(schemaViolation(person_schema, j) == "");
    }
    CHECK(ended >= 4);  // most grammar requests end well within 100 tokens
}

TEST_CASE("structured: an automaton no token can continue ends the request with the end-of-generation token") {
    Lowered s = loweredStories(64);
    // One state, not accepting, every byte refused.
    auto words = std::make_shared<std::vector<uint32_t>>(BLUE_GR_ACCEPT + 2, 0u);
    (*words)[BLUE_GR_STATES] = 1;
    (*words)[BLUE_GR_CLASSES] = 1;
    (*words)[BLUE_GR_ACCEPT + 1] = BLUE_GR_DEAD;
    GenerationRequest r;
    r.max_new = 10;
    r.grammar = words;
    r.sampling.temperature = 0.8f;
    r.prompt = s.tok.promptIds("Once");
    GenerationRequest plain = r;
    plain.tag = 1;
    plain.grammar = nullptr;
    Generated ref = runOnRef(s.module, 2, {r, plain});
    GpuGenerated gpu = runOnGpu(s.module, 2, {r, plain});
    CHECK(ref.tokens[0].empty());
    CHECK(gpu.out.tokens[0].empty());
    CHECK(gpu.out.tokens[1].size() == 10);  // the instance beside it is not constrained
    CHECK(gpu.out.tokens[1] == ref.tokens[1]);
}

// A random schema of the subset structured output supports, `depth` levels of nesting at most.
nlohmann::json randomSchema(std::mt19937& rng, int depth) {
    auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
    int kind = pick(depth > 0 ? 9 : 6);
    switch (kind) {
        case 0: return {{"type", "string"}, {"maxLength", 1 + pick(10)}};
        case 1: return {{"type", "integer"}, {"minimum", -pick(50)}, {"maximum", pick(1000)}};
        case 2: return {{"type", "number"}};
        case 3: return {{"type", "boolean"}};
        case 4: return {{"enum", {"a\"b", "tab\there", "caf\u00e9", "x\\y", 7, nullptr}}};
        case 5: return {{"type", "null"}};
        case 6:
        case 7: {
            nlohmann::json props = nlohmann::json::object(), required = nlohmann::json::array();
            int n = 1 + pick(4);
            for (int i = 0; i < n; ++i) {
                std::string name = "k" + std::to_string(i) + (pick(3) == 0 ? "\"q" : "");
                props[name] = randomSchema(rng, depth - 1);
                if (pick(2)) required.push_back(name);
            }
            return {{"type", "object"}, {"properties", props}, {"required", required}};
        }
        default:
            return {{"type", "array"}, {"items", randomSchema(rng, depth - 1)}, {"maxItems", 1 + pick(3)}};
    }
}

TEST_CASE("structured: 200 random JSON schemas sampled with stories260K through the Engine, every output valid") {
    EngineOptions eo;
    eo.instances = 16;
    eo.ctx = 320;
    auto engine = Engine::open(storiesPath(), eo);
    REQUIRE_MESSAGE(engine.isOk(), engine.message());
    Engine& e = *engine.value();
    std::mt19937 rng(2026);
    std::vector<nlohmann::json> schemas;
    std::vector<GenerationRequest> reqs;
    for (uint32_t i = 0; i < 200; ++i) {
        nlohmann::json schema = randomSchema(rng, 3);
        auto g = compileConstraint({ConstraintKind::JsonSchema, schema.dump()}, e.grammarWords());
        REQUIRE_MESSAGE(g.isOk(), schema.dump() << ": " << g.message());
        GenerationRequest r;
        r.max_new = 300;
        r.grammar = g.value();
        r.sampling.temperature = 1.0f;
        r.sampling.seed = i;
        r.prompt = e.promptTokens(i % 3 ? "The answer:" : "");
        schemas.push_back(schema);
        reqs.push_back(r);
    }
    auto results = e.run(reqs);
    REQUIRE_MESSAGE(results.isOk(), results.message());
    uint32_t finished = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
        const Completion& c = results.value()[i];
        if (c.tokens.size() >= reqs[i].max_new) continue;  // cut by max_new: valid so far only
        ++finished;
        const std::string text = textOf(e.tokenizer(), c.tokens);
        CAPTURE(schemas[i].dump());
        CAPTURE(text);
        nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
        REQUIRE(!j.is_discarded());
        CHECK(schemaViolation(schemas[i], j) == "");
    }
    MESSAGE(finished << " of 200 outputs ended by themselves");
    CHECK(finished >= 190);
}

TEST_CASE("structured: a grammar larger than an instance holds is refused with its size") {
    EngineOptions eo;
    eo.ctx = 64;
    eo.grammar_words = 200;
    auto engine = Engine::open(storiesPath(), eo);
    REQUIRE_MESSAGE(engine.isOk(), engine.message());
    auto g = compileConstraint({ConstraintKind::JsonObject, ""}, 200);
    REQUIRE(!g.isOk());
    CHECK(g.message().find("an instance holds 200 (--grammar-words)") != std::string::npos);
    GenerationRequest r;
    r.prompt = engine.value()->promptTokens("x");
    r.grammar = std::make_shared<std::vector<uint32_t>>(201, 1u);
    Status s = engine.value()->validate(r);
    CHECK(s.message().find("an instance holds 200 (--grammar-words)") != std::string::npos);
}

}  // namespace
}  // namespace blue::test
