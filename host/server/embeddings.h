// POST /v1/embeddings in OpenAI's shape: parsing the body into inputs (or a 400 naming the bad
// field) and writing the response from the pooled vectors the engine computed. Pure functions
// over strings and JSON, no HTTP.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "host/server/openai.h"

namespace blue::server {

inline constexpr size_t kMaxEmbeddingInputs = 2048;  // OpenAI's limit per request

struct EmbeddingRequest {
    std::string model;  // as the client named it ("" when absent)
    // One per input: text, or token ids taken as they are.
    struct Input {
        std::string text;
        std::vector<uint32_t> ids;
        bool is_ids = false;
    };
    std::vector<Input> inputs;
    bool base64 = false;      // encoding_format "base64": little-endian float32 bytes, base64
    uint32_t dimensions = 0;  // keep the first N elements, normalised again (0: all)
};

// `input` is a string, an array of strings, an array of token ids, or an array of such arrays;
// none may be empty. `n_embd` bounds `dimensions`, `n_vocab` the token ids.
std::optional<ApiError> parseEmbeddingRequest(const std::string& body, uint32_t n_embd, uint32_t n_vocab,
                                              EmbeddingRequest* out);

// The vector a client gets: the first `dimensions` elements (0: all), scaled to unit length
// (Euclidean; a zero vector stays zero).
std::vector<float> finishEmbedding(const std::vector<float>& pooled, uint32_t dimensions);

// Standard base64 (RFC 4648, padded) of the floats' little-endian bytes.
std::string base64Floats(const std::vector<float>& v);

// {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}], "model",
// "usage": {"prompt_tokens", "total_tokens"}}; `vectors` are finished (finishEmbedding).
nlohmann::json embeddingResponse(const std::vector<std::vector<float>>& vectors, bool base64,
                                 const std::string& model, uint64_t prompt_tokens);

}  // namespace blue::server
