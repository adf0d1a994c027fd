// Tool calling (OpenAI `tools` / `tool_choice` on chat completions): the tools' description the
// prompt carries, the JSON schema of a call that structured output then enforces on the GPU, and
// the answer read back as `tool_calls`. Pure functions over JSON, no HTTP.
//
// A call is the JSON object {"name": TOOL, "arguments": {...}} (its arguments valid against the
// tool's `parameters`). With tool_choice "required" or a named tool the text must be a call;
// with "auto" it is either a call or text that does not start with '{'; with "none" the tools
// are not offered. Parameters may use "$defs"/"definitions" and "$ref" (as pydantic writes them):
// each tool's definitions move to the call schema's root under names of their own.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "host/server/openai.h"

namespace blue::server {

// Reads `tools` and `tool_choice` of a chat request (their shape: names, parameters objects, a
// named choice that exists). `ordered` is the same body parsed keeping key order (the
// parameters' properties are generated in the order the client wrote them).
std::optional<ApiError> parseTools(const nlohmann::json& body, const nlohmann::ordered_json& ordered, ApiRequest* r);

// An assistant message's `tool_calls` as the text of the call it made (the first; the model
// writes one call per turn).
std::optional<ApiError> toolCallsText(const nlohmann::json& calls, size_t index, std::string* out);

// The conversation with the tools described in its system message (added first when there is
// none). Unchanged when no tool is offered.
std::vector<std::pair<std::string, std::string>> withTools(const ApiRequest& r);

// What the text must be: kind "json_schema" (text: the schema of a call) for "required" or a
// named tool, "grammar" (GBNF: a call, or text not starting with '{') for "auto"; "" when no
// tool is offered. Fails on parameters structured output cannot follow, naming the keyword.
std::optional<ApiError> toolConstraint(const ApiRequest& r, std::string* kind, std::string* text);

// Whether the request offers tools (it has some, and tool_choice is not "none").
bool toolsOffered(const ApiRequest& r);

// The finished text as `tool_calls` (an array of one call with the id `id`), or null when it is
// not a call of one of the `offered` tools.
nlohmann::json toolCallsOf(const std::vector<ApiRequest::Tool>& offered, const std::string& text,
                           const std::string& id);

}  // namespace blue::server
