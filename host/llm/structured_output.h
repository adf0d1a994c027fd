// Structured output: what a request's text must follow (a GBNF grammar, a JSON schema, or any
// JSON object), compiled once per request on the host into the byte automaton that SAMPLEG
// applies on the GPU at every step (vm/llm_abi.h BLUE_GR_*). The host never looks at a token:
// the automaton travels with the request and the GPU walks it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vm/status.h"

namespace blue {

enum class ConstraintKind { None, Grammar, JsonSchema, JsonObject };

struct OutputConstraint {
    ConstraintKind kind = ConstraintKind::None;
    std::string text;  // Grammar: GBNF; JsonSchema: the schema as JSON text
};

// json_object: nesting levels at most (fewer when the grammar words do not hold them).
inline constexpr uint32_t kJsonObjectMaxDepth = 8;

using PackedGrammar = std::shared_ptr<const std::vector<uint32_t>>;

// The packed automaton (null for None). Errors name what is wrong and where: "grammar line 3,
// column 7: ...", "schema at /properties/age: ...", "the grammar needs more than N automaton
// states (at most M)". `max_words` bounds the packed size (an instance's grammar tensor; 0: the
// program has none, and every constraint is refused). *too_large (when given) is set when the
// failure is an automaton larger than max_words.
Result<PackedGrammar> compileConstraint(const OutputConstraint& c, uint32_t max_words, bool* too_large = nullptr);

}  // namespace blue
