// compileConstraint (see structured_output.h).
#include "host/llm/structured_output.h"

#include <nlohmann/json.hpp>

#include <map>
#include <mutex>

#include "compiler/grammar/dfa.h"
#include "compiler/grammar/gbnf.h"
#include "compiler/grammar/json_schema.h"

namespace blue {

namespace {

Result<PackedGrammar> compileGbnf(const std::string& gbnf, uint32_t max_words, const char* what,
                                  bool* too_large, const DfaLimits& limits = {}) {
    Result<Grammar> g = parseGbnf(gbnf);
    if (!g) return g.status();
    Result<ByteDfa> d = buildDfa(g.value(), limits);
    if (!d) return d.status();
    auto words = std::make_shared<std::vector<uint32_t>>(packDfa(d.value()));
    if (words->size() > max_words) {
        if (too_large) *too_large = true;
        return BLUE_ERROR("the %s's automaton needs %zu words (%u states x %u byte classes); an instance holds %u "
                          "(--grammar-words)",
                          what, words->size(), d->states(), d->n_classes, max_words);
    }
    return PackedGrammar(std::move(words));
}

}  // namespace

Result<PackedGrammar> compileConstraint(const OutputConstraint& c, uint32_t max_words, bool* too_large) {
    if (c.kind != ConstraintKind::None && max_words == 0) {
        return Status::error("this program has no grammar memory (lowered with --grammar-words 0)");
    }
    switch (c.kind) {
        case ConstraintKind::None: return PackedGrammar();
        case ConstraintKind::Grammar: return compileGbnf(c.text, max_words, "grammar", too_large);
        case ConstraintKind::JsonObject: {
            // Any JSON object, nested as deep as an instance's grammar words allow (each level
            // doubles the automaton: 6 levels in the default 58368 words, 8 at most). The same for
            // every request of an engine: compiled once per size.
            static std::mutex mutex;
            static std::map<uint32_t, PackedGrammar> cache;
            std::lock_guard<std::mutex> lock(mutex);
            if (auto it = cache.find(max_words); it != cache.end()) return it->second;
            for (uint32_t depth = kJsonObjectMaxDepth; depth >= 1; --depth) {
                DfaLimits limits;
                limits.max_depth = depth;
                Result<PackedGrammar> g = compileGbnf(jsonObjectGbnf(), UINT32_MAX, "JSON object grammar", nullptr, limits);
                if (!g) return g.status();
                if (g.value()->size() <= max_words) return cache[max_words] = g.value();
                if (depth == 1) {
                    if (too_large) *too_large = true;
                    return BLUE_ERROR("the JSON object grammar's automaton needs %zu words at least; an instance holds %u "
                                      "(--grammar-words)",
                                      g.value()->size(), max_words);
                }
            }
            return Status::error("unreachable");
        }
        case ConstraintKind::JsonSchema: {
            // Ordered: properties are generated in the order the schema lists them.
            nlohmann::ordered_json schema = nlohmann::ordered_json::parse(c.text, nullptr, false);
            if (schema.is_discarded()) return Status::error("the JSON schema is not valid JSON");
            Result<std::string> gbnf = jsonSchemaToGbnf(schema);
            if (!gbnf) return gbnf.status();
            return compileGbnf(gbnf.value(), max_words, "JSON schema", too_large);
        }
    }
    return Status::error("unknown constraint kind");
}

}  // namespace blue
