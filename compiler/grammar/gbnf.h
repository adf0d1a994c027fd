// GBNF grammars (the grammar language of llama.cpp's structured output), parsed into a Grammar:
// rules whose bodies are trees of sequences, alternatives, character sets, rule references and
// bounded or unbounded repetitions. compiler/grammar/dfa.h turns a Grammar into the byte automaton
// the GPU sampler walks; compiler/grammar/json_schema.h writes GBNF for JSON schemas.
//
// The language accepted:
//   rule      ::= name "::=" alternatives      (name: [a-zA-Z0-9_-]+; a rule runs until the next
//                                              `name ::=`, so it may continue over lines)
//   alternatives ::= sequence ("|" sequence)*  (a sequence may be empty)
//   element   ::= "literal" | [class] | [^class] | . | name | "(" alternatives ")"
//   postfix   ::= * | + | ? | {m} | {m,} | {m,n} | {,n}
// `#` starts a comment to the end of the line. Literals and classes take the escapes \n \r \t
// \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH; other characters stand for themselves (the text is UTF-8).
// Characters are Unicode code points (U+0000..U+10FFFF without the surrogates D800-DFFF); `.` is
// any of them and a negated class is the complement within them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vm/status.h"

namespace blue {

inline constexpr uint32_t kGrammarUnbounded = 0xFFFFFFFFu;  // GrammarNode::max of x* and x+
inline constexpr uint32_t kGrammarMaxCodePoint = 0x10FFFF;

struct GrammarNode {
    enum class Kind : uint8_t { Seq, Alt, Chars, Ref, Repeat };
    Kind kind = Kind::Seq;
    std::vector<uint32_t> children;  // Seq, Alt: node ids in order; Repeat: the one repeated node
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // Chars: inclusive code point ranges,
                                                        // sorted, disjoint, not adjacent
    uint32_t rule = 0;                                  // Ref: index into Grammar::rules
    uint32_t min = 0, max = 0;  // Repeat: counts; max == kGrammarUnbounded for no limit
};

struct GrammarRule {
    std::string name;
    uint32_t body = 0;  // node id
    uint32_t line = 0;  // where it is defined (1-based), for messages
};

// A parsed grammar. Nodes are owned by the grammar and referenced by index; the empty Seq is the
// empty string and Chars without ranges matches nothing.
struct Grammar {
    std::vector<GrammarNode> nodes;
    std::vector<GrammarRule> rules;
    uint32_t root = 0;  // index into rules
};

// Parses GBNF text; `root` names the start rule. Never crashes on malformed text: errors name line
// and column ("grammar line 3, column 12: expected '::=' after rule name 'value'"), undefined rules
// by name, an empty grammar, a rule defined twice, and a missing start rule ("grammar has no rule
// 'root'"). Repetition counts are limited to 10000, parenthesis nesting to 200 and postfix
// operators on one element to 8.
Result<Grammar> parseGbnf(std::string_view text, std::string_view root = "root");

// Appends the UTF-8 encoding of code point `cp` (assumed valid) to `out`.
void appendUtf8(std::string& out, uint32_t cp);

}  // namespace blue
