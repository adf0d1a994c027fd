// Building generation requests (vm/llm_abi.h's message layout) on the host side.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace blue {

struct SamplingParams {
    float temperature = 0.8f;  // 0: greedy
    uint32_t top_k = 40;       // 0: off
    float top_p = 0.95f;       // 1: off
    float min_p = 0.05f;       // 0: off
    float repeat_penalty = 1.0f;
    uint32_t repeat_last_n = 64;
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    uint32_t seed = 0;
};

struct GenerationRequest {
    uint32_t tag = 0;
    uint32_t max_new = 256;
    SamplingParams sampling;
    std::vector<uint32_t> stop_tokens;  // at most BLUE_REQ_MAX_STOP, besides the model's own
    std::vector<uint32_t> prompt;       // token ids
    bool ignore_eog = false;            // generate max_new tokens whatever they are (benchmarks)
    uint32_t start = 0;                 // position of prompt[0]; the instance holds the ones
                                        // before it (a restored KV snapshot)
    bool logprobs = false;              // each token's log-probability (output records)
    uint32_t top_logprobs = 0;          // and the most likely alternatives' (<= BLUE_MAX_TOP_LOGPROBS)
    // Structured output: a packed grammar automaton (vm/llm_abi.h BLUE_GR_*, made by
    // compiler/grammar/dfa.h packDfa); null or empty: none.
    std::shared_ptr<const std::vector<uint32_t>> grammar;
    bool prefix_reuse = true;           // the instance may skip the leading prompt tokens whose KV
                                        // rows it still holds (same output either way)
    uint32_t session = 0;               // 0, or 1 + the session slot the conversation is kept in
    bool session_new = false;           // the slot holds nothing of it yet (BLUE_REQ_FLAG_SESSION_NEW)
    bool embed = false;                 // an embedding of the prompt instead of generation
                                        // (BLUE_REQ_FLAG_EMBED): the pooled vector's elements
                                        // come out as float records
};

// The input-ring message for a request. Stop tokens beyond the limit are dropped (callers check).
std::vector<uint32_t> encodeRequest(const GenerationRequest& r);

}  // namespace blue
