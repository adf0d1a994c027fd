// GBNF parser (see gbnf.h): a recursive-descent reader over the text that builds Grammar nodes,
// then resolves rule references by name once every rule is known.
#include "compiler/grammar/gbnf.h"

#include <algorithm>
#include <map>

namespace blue {
namespace {

constexpr uint32_t kMaxRepeat = 10000;
constexpr int kMaxNesting = 200;
constexpr int kMaxPostfix = 8;  // x*?+... : keeps node trees shallow

bool isNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

int hexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Sorts and merges ranges so that they are disjoint and not adjacent.
void normalizeRanges(std::vector<std::pair<uint32_t, uint32_t>>& r) {
    std::sort(r.begin(), r.end());
    size_t out = 0;
    for (size_t i = 0; i < r.size(); ++i) {
        if (out > 0 && r[i].first <= r[out - 1].second + 1) {
            r[out - 1].second = std::max(r[out - 1].second, r[i].second);
        } else {
            r[out++] = r[i];
        }
    }
    r.resize(out);
}

std::vector<std::pair<uint32_t, uint32_t>> complementRanges(
    const std::vector<std::pair<uint32_t, uint32_t>>& r) {
    std::vector<std::pair<uint32_t, uint32_t>> out;
    uint32_t next = 0;
    for (const auto& [lo, hi] : r) {
        if (lo > next) out.push_back({next, lo - 1});
        next = hi + 1;
    }
    if (next <= kGrammarMaxCodePoint) out.push_back({next, kGrammarMaxCodePoint});
    return out;
}

struct PendingRef {
    uint32_t node;
    std::string name;
    size_t pos;
};

class Parser {
  public:
    explicit Parser(std::string_view text) : s_(text) {}

    Result<Grammar> run(std::string_view root) {
        skipSpace();
        if (pos_ >= s_.size()) return BLUE_ERROR("grammar is empty");
        std::map<std::string, size_t, std::less<>> defined;  // name -> rule index
        while (pos_ < s_.size()) {
            size_t name_pos = pos_;
            std::string name = readName();
            if (name.empty()) return fail(pos_, "expected a rule name, found " + describeHere());
            skipSpace();
            if (s_.substr(pos_, 3) != "::=")
                return fail(pos_, "expected '::=' after rule name '" + name + "'");
            pos_ += 3;
            if (defined.count(name))
                return fail(name_pos, strFormat("rule '%s' is defined twice (first on line %u)",
                                                name.c_str(), g_.rules[defined[name]].line));
            uint32_t line = lineOf(name_pos);
            BLUE_TRY_ASSIGN(uint32_t body, parseAlternatives(0));
            skipSpace();
            if (pos_ < s_.size() && !atRuleStart())
                return fail(pos_, "unexpected " + describeHere());
            defined[name] = g_.rules.size();
            g_.rules.push_back({name, body, line});
        }
        for (const PendingRef& ref : refs_) {
            auto it = defined.find(ref.name);
            if (it == defined.end()) return fail(ref.pos, "undefined rule '" + ref.name + "'");
            g_.nodes[ref.node].rule = uint32_t(it->second);
        }
        auto it = defined.find(root);
        if (it == defined.end())
            return BLUE_ERROR("grammar has no rule '%.*s'", int(root.size()), root.data());
        g_.root = uint32_t(it->second);
        return std::move(g_);
    }

  private:
    std::string_view s_;
    size_t pos_ = 0;
    Grammar g_;
    std::vector<PendingRef> refs_;

    uint32_t lineOf(size_t pos) const {
        return 1 + uint32_t(std::count(s_.begin(), s_.begin() + std::min(pos, s_.size()), '\n'));
    }

    Status fail(size_t pos, const std::string& message) const {
        pos = std::min(pos, s_.size());
        size_t line_start = 0;
        if (pos > 0) {
            size_t nl = s_.rfind('\n', pos - 1);
            if (nl != std::string_view::npos) line_start = nl + 1;
        }
        return BLUE_ERROR("grammar line %u, column %u: %s", lineOf(pos),
                          uint32_t(pos - line_start + 1), message.c_str());
    }

    std::string describeHere() const {
        if (pos_ >= s_.size()) return "end of text";
        unsigned char c = static_cast<unsigned char>(s_[pos_]);
        if (c >= 0x21 && c < 0x7F) return strFormat("'%c'", c);
        return strFormat("byte 0x%02X", c);
    }

    void skipSpace() {
        while (pos_ < s_.size()) {
            char c = s_[pos_];
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                ++pos_;
            } else if (c == '#') {
                while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
            } else {
                break;
            }
        }
    }

    std::string readName() {
        size_t start = pos_;
        while (pos_ < s_.size() && isNameChar(s_[pos_])) ++pos_;
        return std::string(s_.substr(start, pos_ - start));
    }

    // Whether a new rule (`name ::=`) starts at the current position.
    bool atRuleStart() {
        size_t save = pos_;
        bool yes = !readName().empty();
        if (yes) {
            skipSpace();
            yes = s_.substr(pos_, 3) == "::=";
        }
        pos_ = save;
        return yes;
    }

    uint32_t addNode(GrammarNode n) {
        g_.nodes.push_back(std::move(n));
        return uint32_t(g_.nodes.size() - 1);
    }

    Result<uint32_t> parseAlternatives(int depth) {
        if (depth > kMaxNesting) return fail(pos_, "parentheses nested too deeply");
        GrammarNode alt;
        alt.kind = GrammarNode::Kind::Alt;
        while (true) {
            BLUE_TRY_ASSIGN(uint32_t seq, parseSequence(depth));
            alt.children.push_back(seq);
            skipSpace();
            if (pos_ >= s_.size() || s_[pos_] != '|') break;
            ++pos_;
        }
        if (alt.children.size() == 1) return alt.children[0];
        return addNode(std::move(alt));
    }

    Result<uint32_t> parseSequence(int depth) {
        GrammarNode seq;
        seq.kind = GrammarNode::Kind::Seq;
        while (true) {
            skipSpace();
            if (pos_ >= s_.size() || s_[pos_] == '|' || s_[pos_] == ')' || atRuleStart()) break;
            BLUE_TRY_ASSIGN(uint32_t elem, parseElement(depth));
            BLUE_TRY_ASSIGN(elem, parsePostfix(elem));
            seq.children.push_back(elem);
        }
        if (seq.children.size() == 1) return seq.children[0];
        return addNode(std::move(seq));
    }

    Result<uint32_t> parseElement(int depth) {
        size_t start = pos_;
        char c = s_[pos_];
        if (c == '"') return parseLiteral();
        if (c == '[') return parseClass();
        if (c == '.') {
            ++pos_;
            GrammarNode n;
            n.kind = GrammarNode::Kind::Chars;
            n.ranges = {{0, kGrammarMaxCodePoint}};
            return addNode(std::move(n));
        }
        if (c == '(') {
            ++pos_;
            BLUE_TRY_ASSIGN(uint32_t inner, parseAlternatives(depth + 1));
            skipSpace();
            if (pos_ >= s_.size() || s_[pos_] != ')')
                return fail(pos_, strFormat("expected ')' to close the '(' on line %u, found %s",
                                            lineOf(start), describeHere().c_str()));
            ++pos_;
            return inner;
        }
        if (isNameChar(c)) {
            GrammarNode n;
            n.kind = GrammarNode::Kind::Ref;
            uint32_t id = addNode(std::move(n));
            refs_.push_back({id, readName(), start});
            return id;
        }
        return fail(pos_, "unexpected " + describeHere());
    }

    Result<uint32_t> readCount() {
        uint64_t v = 0;
        size_t start = pos_;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
            v = v * 10 + uint64_t(s_[pos_] - '0');
            if (v > kMaxRepeat)
                return fail(start, strFormat("repetition count over %u", kMaxRepeat));
            ++pos_;
        }
        return uint32_t(v);
    }

    Result<uint32_t> parsePostfix(uint32_t elem) {
        for (int applied = 0;; ++applied) {
            size_t save = pos_;
            skipSpace();
            if (pos_ >= s_.size()) return elem;
            char c = s_[pos_];
            GrammarNode rep;
            rep.kind = GrammarNode::Kind::Repeat;
            rep.children = {elem};
            if (c == '*' || c == '+' || c == '?') {
                ++pos_;
                rep.min = c == '+' ? 1 : 0;
                rep.max = c == '?' ? 1 : kGrammarUnbounded;
            } else if (c == '{') {
                size_t open = pos_++;
                skipSpace();
                bool has_min = pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9';
                BLUE_TRY_ASSIGN(rep.min, readCount());
                skipSpace();
                rep.max = rep.min;
                if (pos_ < s_.size() && s_[pos_] == ',') {
                    ++pos_;
                    skipSpace();
                    bool has_max = pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9';
                    BLUE_TRY_ASSIGN(rep.max, readCount());
                    if (!has_max) rep.max = kGrammarUnbounded;
                    if (!has_min && !has_max) return fail(open, "repetition '{,}' needs a count");
                    skipSpace();
                } else if (!has_min) {
                    return fail(pos_, "expected a count in '{...}', found " + describeHere());
                }
                if (pos_ >= s_.size() || s_[pos_] != '}')
                    return fail(pos_,
                                "expected '}' to end the repetition, found " + describeHere());
                ++pos_;
                if (rep.max < rep.min)
                    return fail(open,
                                strFormat("repetition {%u,%u}: the maximum is below the minimum",
                                          rep.min, rep.max));
            } else {
                pos_ = save;
                return elem;
            }
            if (applied == kMaxPostfix) return fail(save, "too many repetition operators in a row");
            elem = addNode(std::move(rep));
        }
    }

    // Reads one character of a literal or class (the opening quote or bracket already consumed).
    Result<uint32_t> readChar() {
        size_t start = pos_;
        unsigned char c = static_cast<unsigned char>(s_[pos_]);
        if (c == '\n' || c == '\r') return fail(pos_, "line break inside a literal or class");
        if (c == '\\') {
            if (++pos_ >= s_.size()) return fail(start, "unterminated escape");
            char e = s_[pos_++];
            switch (e) {
                case 'n':
                    return uint32_t('\n');
                case 'r':
                    return uint32_t('\r');
                case 't':
                    return uint32_t('\t');
                case '\\':
                case '"':
                case '[':
                case ']':
                    return uint32_t(e);
                case 'x':
                case 'u':
                case 'U': {
                    int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                    uint32_t v = 0;
                    for (int i = 0; i < digits; ++i, ++pos_) {
                        int h = pos_ < s_.size() ? hexValue(s_[pos_]) : -1;
                        if (h < 0)
                            return fail(pos_,
                                        strFormat("escape \\%c needs %d hex digits", e, digits));
                        v = v * 16 + uint32_t(h);
                    }
                    if (v > kGrammarMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
                        return fail(start,
                                    strFormat("escape names U+%X, not a Unicode scalar value", v));
                    return v;
                }
                default:
                    return fail(
                        start, strFormat("unknown escape '\\%s'",
                                         (e > 0x20 && e < 0x7F) ? std::string(1, e).c_str() : "?"));
            }
        }
        // A UTF-8 encoded character.
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || pos_ + len > s_.size()) return fail(pos_, "invalid UTF-8");
        uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
        for (int i = 1; i < len; ++i) {
            unsigned char k = static_cast<unsigned char>(s_[pos_ + i]);
            if ((k & 0xC0) != 0x80) return fail(pos_, "invalid UTF-8");
            cp = (cp << 6) | (k & 0x3F);
        }
        static constexpr uint32_t kMinOfLen[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kMinOfLen[len] || cp > kGrammarMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
            return fail(pos_, "invalid UTF-8");
        pos_ += len;
        return cp;
    }

    Result<uint32_t> parseLiteral() {
        size_t start = pos_++;
        GrammarNode seq;
        seq.kind = GrammarNode::Kind::Seq;
        while (true) {
            if (pos_ >= s_.size()) return fail(start, "unterminated string literal");
            if (s_[pos_] == '"') break;
            BLUE_TRY_ASSIGN(uint32_t cp, readChar());
            GrammarNode ch;
            ch.kind = GrammarNode::Kind::Chars;
            ch.ranges = {{cp, cp}};
            seq.children.push_back(addNode(std::move(ch)));
        }
        ++pos_;
        if (seq.children.size() == 1) return seq.children[0];
        return addNode(std::move(seq));
    }

    Result<uint32_t> parseClass() {
        size_t start = pos_++;
        GrammarNode n;
        n.kind = GrammarNode::Kind::Chars;
        bool negated = pos_ < s_.size() && s_[pos_] == '^';
        if (negated) ++pos_;
        while (true) {
            if (pos_ >= s_.size()) return fail(start, "unterminated character class");
            if (s_[pos_] == ']') break;
            BLUE_TRY_ASSIGN(uint32_t lo, readChar());
            uint32_t hi = lo;
            if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
                size_t range_pos = pos_++;
                BLUE_TRY_ASSIGN(hi, readChar());
                if (hi < lo) return fail(range_pos, "character range is reversed");
            }
            n.ranges.push_back({lo, hi});
        }
        ++pos_;
        normalizeRanges(n.ranges);
        if (negated) n.ranges = complementRanges(n.ranges);
        return addNode(std::move(n));
    }
};

}  // namespace

void appendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

Result<Grammar> parseGbnf(std::string_view text, std::string_view root) {
    return Parser(text).run(root);
}

}  // namespace blue
