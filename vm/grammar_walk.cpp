// GrammarWalk (see grammar_walk.h); the GPU's copy of these rules is shaders/sample.comp (GRAMMAR).
#include "vm/grammar_walk.h"

#include "vm/llm_abi.h"

namespace blue {

namespace {
uint64_t acceptWords(uint64_t states) { return (states + 31) / 32; }
}  // namespace

bool GrammarWalk::active() const {
    if (g.size() < BLUE_GR_HEADER_WORDS) return false;
    uint64_t states = g[BLUE_GR_STATES], classes = g[BLUE_GR_CLASSES];
    if (states == 0 || states >= BLUE_GR_DEAD || classes == 0 || classes > 256) return false;
    if (g[BLUE_GR_STATE] >= states) return false;
    uint64_t need = BLUE_GR_ACCEPT + acceptWords(states) + (states * classes + 1) / 2;
    return need <= g.size() && tb.size() >= vocab;
}

bool GrammarWalk::accepting(uint32_t state) const {
    return (g[BLUE_GR_ACCEPT + state / 32] >> (state % 32)) & 1u;
}

uint32_t GrammarWalk::kind(uint32_t token) const {
    if (token >= vocab) return BLUE_TB_NONE;
    return (tb[token] >> 8) & 3u;
}

uint32_t GrammarWalk::next(uint32_t state, uint32_t token) const {
    if (token >= vocab) return BLUE_GR_DEAD;
    const uint32_t info = tb[token], len = info & 0xFFu, off = info >> 10;
    if (((info >> 8) & 3u) != BLUE_TB_TEXT) return state;
    const uint64_t states = g[BLUE_GR_STATES], classes = g[BLUE_GR_CLASSES];
    const uint64_t table = BLUE_GR_ACCEPT + acceptWords(states);
    for (uint32_t j = 0; j < len && state != BLUE_GR_DEAD; ++j) {
        uint64_t byte_at = uint64_t(off) + j, word = vocab + byte_at / 4;
        if (word >= tb.size()) return BLUE_GR_DEAD;
        uint32_t b = (tb[word] >> (8 * (byte_at % 4))) & 0xFFu;
        uint32_t c = (g[BLUE_GR_CLASS_MAP + b / 4] >> (8 * (b % 4))) & 0xFFu;
        if (c >= classes) return BLUE_GR_DEAD;
        uint64_t e = uint64_t(state) * classes + c;
        state = (g[table + e / 2] >> (16 * (e % 2))) & 0xFFFFu;
        if (state != BLUE_GR_DEAD && state >= states) return BLUE_GR_DEAD;
    }
    return state;
}

bool GrammarWalk::allows(uint32_t state, uint32_t token) const {
    switch (kind(token)) {
        case BLUE_TB_TEXT: return (tb[token] & 0xFFu) != 0 && next(state, token) != BLUE_GR_DEAD;
        case BLUE_TB_END: return accepting(state);
        default: return false;
    }
}

}  // namespace blue
