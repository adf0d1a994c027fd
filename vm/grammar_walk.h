// Reading the grammar automaton and token bytes that SAMPLEG applies (vm/llm_abi.h BLUE_GR_*,
// BLUE_TB_*), for the reference machine and host-side checks. Every read is bounds-checked: the
// words come from a request (the automaton) and a module (the token bytes), both untrusted here.
#pragma once

#include <cstdint>
#include <span>

#include "vm/llm_abi.h"

namespace blue {

struct GrammarWalk {
    std::span<const uint32_t> g;   // the instance's automaton words
    std::span<const uint32_t> tb;  // token bytes: [vocab] info words, then the bytes
    uint32_t vocab = 0;

    // The automaton is present and its tables fit in g (else SAMPLEG samples unconstrained).
    bool active() const;
    uint32_t state() const { return g[2]; }
    bool accepting(uint32_t state) const;
    uint32_t kind(uint32_t token) const;  // BLUE_TB_*
    // The state after `token`'s bytes from `state`, or BLUE_GR_DEAD when one is not allowed
    // (end-of-generation and other byte-less tokens leave it as it is).
    uint32_t next(uint32_t state, uint32_t token) const;
    // Whether SAMPLEG lets `token` be drawn in `state`.
    bool allows(uint32_t state, uint32_t token) const;
};

// The logit SAMPLEG gives a token the grammar does not allow (BLUE_GR_MASKED): low enough that it
// is never drawn nor counted, finite so that entropy sums stay numbers.
inline constexpr float kGrammarMasked = float(BLUE_GR_MASKED);

}  // namespace blue
