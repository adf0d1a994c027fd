// JSON schema -> GBNF: the grammar of JSON texts valid against a schema (OpenAI
// `response_format: {type: "json_schema"}`), and the grammar of any JSON object
// (`{type: "json_object"}`). Compile the text with parseGbnf and buildDfa (dfa.h).
//
// Output format: compact JSON with at most one optional space after ':' and ',' and no other
// whitespace. Object properties appear in the schema's order; required ones always, optional ones
// may be left out. Numbers have at most 16 integer digits, 16 fraction digits and 2 exponent
// digits (so every value fits a double); string escapes \uXXXX never name a surrogate (characters
// outside the BMP are written as UTF-8). Every text of the grammar is valid JSON satisfying the
// schema; not every valid text is in the grammar.
//
// Supported keywords: type (a name or an array of names), enum, const, properties, required,
// additionalProperties (false, true or absent: all three produce only the listed properties, a
// subset of what true/absent allow), items, prefixItems, minItems, maxItems, minLength, maxLength
// (code points), minimum/maximum on integers (exactly, |bounds| <= 1e15), anyOf, oneOf (as
// alternatives, like anyOf: keep oneOf branches disjoint), allOf with one element, $ref to
// #/$defs/NAME, #/definitions/NAME or # (recursion is bounded by DfaLimits::max_depth); the last
// four only without other validation keywords beside them. Subschemas nest at most 64 deep.
// Annotations are ignored: title, description, examples, $schema, $id, $comment, default, format,
// deprecated, readOnly, writeOnly, and keys starting with "x-". Every other keyword changes
// validity in ways the grammar cannot follow, and is refused.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "vm/status.h"

namespace blue {

// GBNF (start rule "root") for values valid against `schema`. Errors name the JSON pointer of the
// offending subschema: "schema at /properties/age: 'type' must be a string or an array of strings".
// Properties keep the order of `schema`: parse requests with nlohmann::ordered_json to keep the
// order the user wrote; a nlohmann::json schema has its keys sorted, and so do the outputs.
Result<std::string> jsonSchemaToGbnf(const nlohmann::ordered_json& schema);
Result<std::string> jsonSchemaToGbnf(const nlohmann::json& schema);

// GBNF (start rule "root") for any JSON object, values nested up to the DFA's depth bound.
std::string jsonObjectGbnf();

}  // namespace blue
