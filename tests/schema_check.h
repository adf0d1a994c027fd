// A small JSON schema validator for the subset compiler/grammar/json_schema.h supports, written
// independently of the grammar writer so tests can check what the grammar produces.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace blue {

// "" when `value` is valid against `schema`, else a message naming the JSON pointer of the first
// violation ("/items/2: 7 is above maximum 5"). Supports type, enum, const, properties, required,
// additionalProperties (boolean), items, prefixItems, minItems, maxItems, minLength, maxLength
// (code points), minimum, maximum, anyOf, oneOf (exactly one), allOf, $ref (#, #/$defs/...,
// #/definitions/...); other keywords are ignored.
std::string schemaViolation(const nlohmann::json& schema, const nlohmann::json& value);

}  // namespace blue
