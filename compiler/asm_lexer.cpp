// Tokenizer for Blue-IR assembly text.
#include "compiler/asm_lexer.h"

#include <cctype>

namespace blue {

namespace {

bool isWordChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '+' ||
           c == '-' || c == '@' || c == '=';
}

int hexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Reads a quoted string or character starting at text[i] (the quote). Advances i past the end.
Status readQuoted(std::string_view text, size_t& i, std::string* out, const std::string& where) {
    char quote = text[i++];
    while (i < text.size() && text[i] != quote) {
        char c = text[i++];
        if (c != '\\') {
            out->push_back(c);
            continue;
        }
        if (i >= text.size()) break;
        char e = text[i++];
        switch (e) {
            case 'n': out->push_back('\n'); break;
            case 't': out->push_back('\t'); break;
            case 'r': out->push_back('\r'); break;
            case '0': out->push_back('\0'); break;
            case '\\': case '"': case '\'': out->push_back(e); break;
            case 'x': {
                int hi = i < text.size() ? hexValue(text[i]) : -1;
                int lo = i + 1 < text.size() ? hexValue(text[i + 1]) : -1;
                if (hi < 0 || lo < 0) return Status::error(where + ": bad \\x escape");
                out->push_back(char(hi * 16 + lo));
                i += 2;
                break;
            }
            default: return Status::error(where + strFormat(": unknown escape \\%c", e));
        }
    }
    if (i >= text.size()) return Status::error(where + ": unterminated quote");
    ++i;
    return Status::ok();
}

}  // namespace

Status tokenizeSource(std::string_view source, const std::string& name, std::vector<Line>* out) {
    uint32_t number = 0;
    size_t start = 0;
    while (start <= source.size()) {
        size_t end = source.find('\n', start);
        if (end == std::string_view::npos) end = source.size();
        std::string_view text = source.substr(start, end - start);
        ++number;
        Line line{number, {}};
        size_t i = 0;
        while (i < text.size()) {
            char c = text[i];
            std::string where = strFormat("%s:%u:%zu", name.c_str(), number, i + 1);
            if (c == ';' || c == '#') break;
            if (std::isspace(static_cast<unsigned char>(c))) {
                ++i;
                continue;
            }
            Token tok;
            tok.col = i;
            if (c == '"' || c == '\'') {
                tok.kind = c == '"' ? Token::STRING : Token::CHAR;
                BLUE_TRY(readQuoted(text, i, &tok.text, where));
                if (tok.kind == Token::CHAR && tok.text.size() != 1) {
                    return Status::error(where + ": a character literal holds one character");
                }
            } else if (c == ',' || c == ':' || c == '[' || c == ']') {
                tok.kind = c == ',' ? Token::COMMA : c == ':' ? Token::COLON
                           : c == '[' ? Token::LBRACK : Token::RBRACK;
                tok.text = std::string(1, c);
                ++i;
            } else if (isWordChar(c)) {
                while (i < text.size() && isWordChar(text[i])) tok.text.push_back(text[i++]);
            } else {
                return Status::error(where + strFormat(": unexpected character '%c'", c));
            }
            line.toks.push_back(std::move(tok));
        }
        if (!line.toks.empty()) out->push_back(std::move(line));
        start = end + 1;
    }
    return Status::ok();
}

Status splitOperands(const Line& line, size_t first, std::vector<Token>* out,
                     const std::string& name) {
    bool want_operand = true;
    for (size_t i = first; i < line.toks.size(); ++i) {
        const Token& t = line.toks[i];
        bool comma = t.kind == Token::COMMA;
        if (comma == want_operand) {
            return BLUE_ERROR("%s:%u:%zu: %s", name.c_str(), line.number, t.col + 1,
                              comma ? "missing operand before ','" : "missing ',' between operands");
        }
        if (!comma) out->push_back(t);
        want_operand = comma;
    }
    if (!out->empty() && want_operand) {
        return BLUE_ERROR("%s:%u:%zu: trailing ','", name.c_str(), line.number,
                          line.toks.back().col + 1);
    }
    return Status::ok();
}

Result<uint32_t> parseRegister(const Token& tok) {
    const std::string& s = tok.text;
    if (tok.kind == Token::WORD && s.size() >= 2 && s.size() <= 4 && (s[0] == 'r' || s[0] == 'R')) {
        uint32_t v = 0;
        bool digits = true;
        for (size_t i = 1; i < s.size(); ++i) {
            digits &= std::isdigit(static_cast<unsigned char>(s[i])) != 0;
            v = v * 10 + uint32_t(s[i] - '0');
        }
        if (digits && v < 256 && !(s.size() > 2 && s[1] == '0')) return v;
    }
    return BLUE_ERROR("expected a register r0..r255, found '%s'", s.c_str());
}

std::string quoteString(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        switch (c) {
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            case '\\': out += "\\\\"; break;
            case '"': out += "\\\""; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) {
                    out += strFormat("\\x%02x", static_cast<unsigned char>(c));
                } else {
                    out.push_back(c);
                }
        }
    }
    return out + "\"";
}

}  // namespace blue
