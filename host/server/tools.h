// Tool calling (OpenAI `tools` / `tool_choice` / `parallel_tool_calls` on chat completions): the
// tools' description the prompt carries, what a call must look like (a grammar or schema that
// structured output then enforces on the GPU), and the answer read back as `tool_calls`. Pure
// functions over JSON, no HTTP.
//
// A call is a tool's name and arguments valid against its `parameters`, written in the tool
// format of the model's family (ToolFormat): the format the model was trained on where BlueVM
// knows it, else a generic JSON one. With tool_choice "required" or a named tool the answer must
// be calls; with "auto" it is calls or text that cannot be taken for the start of one; with
// "none" the tools are not offered. `parallel_tool_calls` (default true) lets an answer hold
// several calls where the format has a way to write them. Parameters may use "$defs" /
// "definitions" and "$ref" (as pydantic writes them): each tool's definitions move to the call
// schema's root under names of their own.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "host/server/openai.h"

namespace blue::server {

// How a model family writes tool calls and reads their results.
enum class ToolFormat {
    // Generic (any template): the JSON object {"name", "arguments"}, or an array of them for
    // several calls; results in a "tool" turn (a user turn "Tool result: ..." where the template
    // has no such role).
    Json,
    // Hermes / Qwen 2.5 (ChatML templates): the tools' signatures inside <tools></tools>, each
    // call's {"name", "arguments"} inside <tool_call></tool_call>, one block per call; results
    // in a user turn inside <tool_response></tool_response>.
    Hermes,
    // Llama 3.1+ JSON tool calls: {"name", "parameters"}, one call per answer; results in the
    // "ipython" role.
    Llama3,
    // Mistral (v3, tekken and v7 templates): the tools' signatures inside [AVAILABLE_TOOLS]
    // before the last user message, the calls as one JSON array after the [TOOL_CALLS] control
    // token (which answers show: Tokenizer::hidden), results inside [TOOL_RESULTS] as
    // {"content", "call_id"}.
    Mistral,
};

// "json", "hermes", "llama3", "mistral".
std::string_view toolFormatName(ToolFormat f);
std::optional<ToolFormat> toolFormatFromName(std::string_view name);
// The format a chat template family (chatTemplateName: "chatml", "llama3", ...) was trained on:
// ChatML -> Hermes, Llama 3 -> Llama3, Mistral v3 / v3-tekken / v7 -> Mistral, every other
// family -> Json.
ToolFormat toolFormatForTemplate(std::string_view chat_template);
// Whether a model whose chat template is `chat_template` can take format `f`: Mistral's needs a
// Mistral template with tool markers (the roles it writes exist only there); the others go
// with any template.
bool toolFormatFits(ToolFormat f, std::string_view chat_template);

// Reads `tools`, `tool_choice` and `parallel_tool_calls` of a chat request (their shape: names,
// parameters objects, a named choice that exists). `ordered` is the same body parsed keeping key
// order (the parameters' properties are generated in the order the client wrote them).
std::optional<ApiError> parseTools(const nlohmann::json& body, const nlohmann::ordered_json& ordered, ApiRequest* r);

// An assistant message's `tool_calls` (messages[index]) as calls {"name", "arguments"} (and
// "id" where the call has a string id), every one of them, in order.
std::optional<ApiError> messageCalls(const nlohmann::json& calls, size_t index,
                                     std::vector<nlohmann::ordered_json>* out);

// The conversation as roles and texts for the chat template, in format `f`: the tools described
// in the system message (added first when there is none; Mistral: an `available_tools` turn
// before the last user message) when they are offered, the calls of earlier assistant turns
// written as the format writes them, tool results in the format's role.
std::vector<std::pair<std::string, std::string>> withTools(const ApiRequest& r, ToolFormat f);

// The most calls one answer may hold with parallel_tool_calls: the bound ends a model's run of
// calls (the automaton then allows only the end), and keeps the automaton finite in size.
constexpr uint32_t kMaxParallelCalls = 4;

// What the text must be in format `f`: kind "json_schema" (text: a schema) or "grammar" (GBNF);
// "" when no tool is offered. Up to kMaxParallelCalls calls with parallel_tool_calls (where the
// format has them), else one. Fails on parameters structured output cannot
// follow, naming the keyword.
std::optional<ApiError> toolConstraint(const ApiRequest& r, ToolFormat f, std::string* kind, std::string* text);

// Whether an answer whose text so far is `text` is text, not calls, in format `f`: its first
// byte cannot start a call ("auto" allows text only where it cannot). A stream sends such an
// answer as it comes instead of holding it until the end.
bool answerIsText(ToolFormat f, std::string_view text);

// Whether the request offers tools (it has some, and tool_choice is not "none").
bool toolsOffered(const ApiRequest& r);

// The finished text, read in format `f`, as `tool_calls`: an array of the calls it makes, the
// k-th with the id `id` + "_" + k; null when the text is not calls of the `offered` tools (it
// is then the answer's content).
nlohmann::json toolCallsOf(const std::vector<ApiRequest::Tool>& offered, ToolFormat f, const std::string& text,
                           const std::string& id);

}  // namespace blue::server
