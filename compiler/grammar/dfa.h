// Grammar -> ByteDfa: the deterministic automaton over UTF-8 bytes that the GPU sampler walks to
// mask tokens (vm/llm_abi.h BLUE_GR_*), built once per request.
//
// Each rule becomes a small byte-level NFA whose rule references are call edges. The automaton's
// states are sets of parser configurations (a configuration is a stack of NFA states: the return
// points of the rules being expanded, the current position on top), determinized by subset
// construction. A reference that is the last thing its rule does is a tail call and pushes
// nothing, so right recursion (lists, repetition) costs no depth. Recursion is bounded: a
// configuration is dropped when its stack would hold more than DfaLimits::max_depth frames of
// recursive calls (references from a rule into its own strongly connected component). Frames of
// references down to rules that cannot lead back are not counted: they nest at most once per rule.
// So the automaton accepts a subset of the grammar's language: every text it accepts is a
// sentence, and sentences nested deeper than the bound cannot be produced. With the JSON grammars
// of json_schema.h, max_depth is the number of nested arrays/objects that hold values (one more
// level may be empty: `[]`, `{}`). Left recursion terminates by the same bound.
//
// The result is minimized (Moore's partition refinement), states that cannot reach acceptance are
// removed (their transitions become 0xFFFF), the start state is 0, and bytes that behave alike
// everywhere share a class.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "compiler/grammar/gbnf.h"
#include "vm/status.h"

namespace blue {

struct DfaLimits {
    uint32_t max_states = 65000;  // after minimization; at most 65534 (u16 ids, 0xFFFF = dead)
    uint32_t max_depth = 8;       // recursion bound, see above (0 allows no recursive call)
};

inline constexpr uint16_t kDfaDead = 0xFFFF;

struct ByteDfa {
    uint32_t start = 0;
    uint32_t n_classes = 0;  // byte equivalence classes, <= 256
    std::array<uint8_t, 256> byte_class{};
    std::vector<uint16_t> next;      // [state * n_classes + class]; kDfaDead: byte not allowed
    std::vector<uint8_t> accepting;  // per state: 1 when the text so far is a complete sentence
    uint32_t states() const { return uint32_t(accepting.size()); }
};

// Builds the minimized automaton of `g` from its root rule. Fails (never hangs) when the grammar
// expands to too many NFA states, when the automaton needs more than limits.max_states states
// ("grammar needs more than N automaton states (at most M)"; checked while building, so huge
// grammars fail fast), when building takes more than a fixed work budget (about a second; "grammar
// is too complex: ..."), or when no text is accepted within the depth bound.
Result<ByteDfa> buildDfa(const Grammar& g, const DfaLimits& limits = {});

// Whether the whole of `text` is a sentence of the automaton.
bool dfaAccepts(const ByteDfa& d, std::string_view text);

// The u32 words the GPU reads (vm/llm_abi.h BLUE_GR_*):
//   w[0] = states, w[1] = n_classes, w[2] = current state (= start), w[3] = 0,
//   w[4 .. 68): the 256 byte classes, byte b in bits 8 * (b % 4) of word 4 + b / 4,
//   then A = ceil(states / 32) words of accepting bits (state s: bit s % 32 of word 68 + s / 32),
//   then ceil(states * n_classes / 2) words of next states, entry e = s * n_classes + c in bits
//   16 * (e % 2) of word 68 + A + e / 2 (0xFFFF = dead).
std::vector<uint32_t> packDfa(const ByteDfa& d);

}  // namespace blue
