// Tokenizer for Blue-IR assembly text (see asm.h for the syntax).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vm/status.h"

namespace blue {

struct Token {
    enum Kind { WORD, STRING, CHAR, COMMA, COLON, LBRACK, RBRACK };
    Kind kind = WORD;
    std::string text;  // unescaped contents for STRING and CHAR
    size_t col = 0;    // 0-based column
};

struct Line {
    uint32_t number = 0;  // 1-based
    std::vector<Token> toks;
};

// Splits source into non-empty lines of tokens. Errors name NAME:LINE:COL.
Status tokenizeSource(std::string_view source, const std::string& name, std::vector<Line>* out);

// Collects comma-separated single-token operands starting at token `first`.
Status splitOperands(const Line& line, size_t first, std::vector<Token>* out,
                     const std::string& name);

// Parses "r0".."r255".
Result<uint32_t> parseRegister(const Token& tok);

// Quotes a string with the escapes tokenizeSource understands.
std::string quoteString(std::string_view s);

}  // namespace blue
