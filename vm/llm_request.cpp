// encodeRequest (see llm_request.h).
#include "vm/llm_request.h"

#include <algorithm>
#include <bit>
#include <cstddef>

#include "vm/llm_abi.h"

namespace blue {

std::vector<uint32_t> encodeRequest(const GenerationRequest& r) {
    std::vector<uint32_t> w(BLUE_REQ_HEADER, 0);
    const SamplingParams& s = r.sampling;
    w[BLUE_REQ_TAG] = r.tag;
    w[BLUE_REQ_PROMPT_LEN] = uint32_t(r.prompt.size());
    w[BLUE_REQ_MAX_NEW] = r.max_new;
    w[BLUE_REQ_TEMP] = std::bit_cast<uint32_t>(s.temperature);
    w[BLUE_REQ_TOP_K] = s.top_k;
    w[BLUE_REQ_TOP_P] = std::bit_cast<uint32_t>(s.top_p);
    w[BLUE_REQ_MIN_P] = std::bit_cast<uint32_t>(s.min_p);
    w[BLUE_REQ_REPEAT_PENALTY] = std::bit_cast<uint32_t>(s.repeat_penalty);
    w[BLUE_REQ_REPEAT_LAST_N] = s.repeat_last_n;
    w[BLUE_REQ_PRESENCE] = std::bit_cast<uint32_t>(s.presence_penalty);
    w[BLUE_REQ_FREQUENCY] = std::bit_cast<uint32_t>(s.frequency_penalty);
    w[BLUE_REQ_SEED] = s.seed;
    size_t n_stop = std::min<size_t>(r.stop_tokens.size(), BLUE_REQ_MAX_STOP);
    w[BLUE_REQ_N_STOP] = uint32_t(n_stop);
    for (size_t i = 0; i < n_stop; ++i) w[BLUE_REQ_STOP + i] = r.stop_tokens[i];
    w[BLUE_REQ_FLAGS] = (r.ignore_eog ? BLUE_REQ_FLAG_IGNORE_EOG : 0u) | (r.prefix_reuse ? 0u : BLUE_REQ_FLAG_NO_PREFIX) |
                          (r.embed ? BLUE_REQ_FLAG_EMBED : 0u) | (r.session_new ? BLUE_REQ_FLAG_SESSION_NEW : 0u);
    w[BLUE_REQ_SESSION] = r.session;
    w[BLUE_REQ_START] = r.start;
    w[BLUE_REQ_LOGPROBS] = r.logprobs || r.top_logprobs ? 1 + std::min<uint32_t>(r.top_logprobs, BLUE_MAX_TOP_LOGPROBS) : 0;
    const size_t g = r.grammar ? r.grammar->size() : 0;
    w.push_back(uint32_t(g));
    if (g) w.insert(w.end(), r.grammar->begin(), r.grammar->end());
    w.insert(w.end(), r.prompt.begin(), r.prompt.end());
    return w;
}

}  // namespace blue
