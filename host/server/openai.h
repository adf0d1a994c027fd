// The OpenAI-compatible request and response formats: parsing a /v1/completions or
// /v1/chat/completions body into a generation request (or a 400 naming the bad field), and the
// JSON of responses, stream chunks and errors. Pure functions over strings and JSON, no HTTP.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace blue::server {

enum class Endpoint { Completions, Chat };

// A validated request. Either `prompt` (text), `prompt_ids` or `messages` is set.
struct ApiRequest {
    Endpoint endpoint = Endpoint::Completions;
    std::string model;  // as the client named it ("" when absent)
    std::string prompt;
    std::vector<uint32_t> prompt_ids;
    bool has_prompt_ids = false;
    // A chat message. An assistant message's tool calls are kept apart from its text: each is
    // {"name": ..., "arguments": {...}}, written back in the model's tool format (tools.h).
    struct Message {
        std::string role, content;
        std::vector<nlohmann::ordered_json> calls;  // {"name", "arguments"[, "id"]}
        std::string tool_call_id;                    // a tool message's, when given
    };
    std::vector<Message> messages;
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    uint32_t max_tokens = 0;     // 0: until the context is full or the model stops
    float temperature = 1.0f;
    float top_p = 1.0f;
    uint32_t top_k = 0;
    float min_p = 0.0f;
    float repeat_penalty = 1.0f;
    float presence_penalty = 0.0f, frequency_penalty = 0.0f;
    uint32_t seed = 0;
    bool seed_given = false;
    std::vector<std::string> stop;
    bool echo = false;        // completions: the prompt text starts the completion
    bool ignore_eos = false;  // extension: generate max_tokens tokens whatever they are
    std::string session_id;   // extension: the conversation this request is a turn of ("" none;
                              // kept in a session slot, see bluevm_request.session)
    bool cache_prompt = true; // extension (llama.cpp's name): false recomputes the whole prompt
                              // instead of reusing the instance's KV rows of its leading tokens
    // Completions `logprobs: N`, chat `logprobs: true` with `top_logprobs: N` (N <= 20).
    bool logprobs = false;
    uint32_t top_logprobs = 0;
    // Structured output, at most one: `response_format` {"type": "json_object"} or
    // {"type": "json_schema", "json_schema": {"schema": ...}}; the extensions `grammar` (GBNF
    // text) and `json_schema` (a schema), as llama.cpp's server names them.
    bool json_object = false;
    std::string json_schema;  // the schema as JSON text ("" when none)
    std::string grammar;      // GBNF ("" when none)
    std::string format_param; // the field it came from, for errors found when it is compiled
    // Chat tools (host/server/tools.h): name, description, parameters (a schema, JSON text).
    struct Tool {
        std::string name, description, parameters;
    };
    std::vector<Tool> tools;
    std::string tool_choice;  // "none", "auto", "required", or a tool's name ("" without tools)
    bool parallel_tool_calls = true;  // several calls in one answer (where the format has them)
};

// A client error: the HTTP status and the OpenAI error body's fields.
struct ApiError {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;  // the offending field, "" when none
    std::string code;   // e.g. "model_not_found"
};

// Parses and validates a request body. `max_context` bounds max_tokens.
std::optional<ApiError> parseRequest(Endpoint endpoint, const std::string& body,
                                     uint32_t max_context, ApiRequest* out);

// {"error": {...}}
std::string errorBody(const ApiError& e);

struct Usage {
    uint32_t prompt_tokens = 0, completion_tokens = 0;
    uint32_t cached_tokens = 0;  // prompt tokens not recomputed (prefix reuse)
};

// One generated token's log-probabilities, with the texts of it and its alternatives.
struct TokenLogprob {
    std::string token;
    float logprob = 0;
    std::vector<std::pair<std::string, float>> top;  // most likely first
};
inline constexpr uint32_t kMaxTopLogprobs = 20;  // vm/llm_abi.h BLUE_MAX_TOP_LOGPROBS

// A choice's "logprobs" object for these tokens: completions {tokens, token_logprobs,
// top_logprobs, text_offset} (offsets from `text_offset`, the bytes before the first token);
// chat {content: [{token, logprob, bytes, top_logprobs}]}.
// A text's bytes as a JSON array of their values (logprobs' "bytes", /tokenize's pieces that
// are not whole UTF-8).
nlohmann::json bytesJson(std::string_view s);
nlohmann::json logprobsJson(Endpoint endpoint, const std::vector<TokenLogprob>& tokens, size_t text_offset);

// The complete (non-streamed) response.
std::string responseBody(Endpoint endpoint, const std::string& id, int64_t created,
                         const std::string& model, const std::string& text,
                         const std::string& finish_reason, const Usage& usage,
                         const nlohmann::json& extra = nullptr,  // an object: its fields are added
                         const nlohmann::json& logprobs = nullptr,  // the choice's "logprobs"
                         const nlohmann::json& tool_calls = nullptr);  // chat: an array answers them

// One server-sent event ("data: {...}\n\n"). `role_chunk` (chat): the first chunk, which carries
// the assistant role; `finish_reason` non-empty: the last chunk; `usage`: the usage-only chunk
// that stream_options.include_usage asks for.
std::string streamChunk(Endpoint endpoint, const std::string& id, int64_t created,
                        const std::string& model, const std::string& text,
                        const std::string& finish_reason, bool role_chunk = false,
                        const nlohmann::json& logprobs = nullptr,
                        const nlohmann::json& tool_calls = nullptr);  // chat: a delta of them
std::string usageChunk(Endpoint endpoint, const std::string& id, int64_t created,
                       const std::string& model, const Usage& usage);
inline constexpr const char* kStreamDone = "data: [DONE]\n\n";

}  // namespace blue::server
