// Unigram (`tokenizer.ggml.model` = "t5"): SentencePiece's normalizer (the precompiled
// character map when the vocabulary carries one, extra whitespace removed when asked, a space
// prefix, spaces as U+2581), then Viterbi over the pieces' scores: the segmentation whose
// pieces' log-probabilities sum highest. A character no piece covers is the unknown token, scored
// SentencePiece's way (10 below the lowest piece score); unknowns in a row become one.
#include <limits>

#include "compiler/tokenizer_internal.h"

namespace blue {
namespace {

constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581
constexpr float kUnkPenalty = 10.0f;

// Longest prefix of `text` in the character map's double array (Darts-clone layout: each 32-bit
// unit holds a byte label, a has-leaf flag and the offset to its children; the unit a leaf-bearing
// node's offset leads to holds the value, here where the replacement text starts in the pool).
// Returns the prefix length and the value, or {0, 0}; never reads outside the array.
std::pair<size_t, uint32_t> charsmapLongest(const TokenizerState& s, std::string_view text) {
    const std::vector<uint32_t>& units = s.charsmap_units;
    if (units.empty()) return {0, 0};
    auto offset = [](uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
    auto label = [](uint32_t u) { return u & ((1u << 31) | 0xFF); };
    auto hasLeaf = [](uint32_t u) { return (u >> 8) & 1; };
    size_t best_len = 0;
    uint32_t best_value = 0;
    size_t pos = offset(units[0]);
    for (size_t i = 0; i < text.size(); ++i) {
        uint8_t c = uint8_t(text[i]);
        if (c == 0) break;
        pos ^= c;
        if (pos >= units.size()) break;
        const uint32_t unit = units[pos];
        if (label(unit) != c) break;
        pos ^= offset(unit);
        if (pos >= units.size()) break;
        if (hasLeaf(unit)) {  // the value sits in the unit the offset leads to
            best_len = i + 1;
            best_value = units[pos] & 0x7FFFFFFFu;
        }
    }
    return {best_len, best_value};
}

// The replacement for what starts raw[i]: the character map's longest entry, else the character
// itself (a malformed byte reads as U+FFFD). Returns the bytes consumed.
size_t normalizePrefix(const TokenizerState& s, std::string_view raw, size_t i, std::string& sp) {
    auto [len, value] = charsmapLongest(s, raw.substr(i));
    if (len > 0 && value < s.charsmap_pool.size()) {
        sp.assign(s.charsmap_pool.c_str() + value);
        return len;
    }
    size_t n = utf8CharLen(raw, i);
    if (n == 1 && uint8_t(raw[i]) >= 0x80) {
        sp.assign("\xef\xbf\xbd");
    } else {
        sp.assign(raw, i, n);
    }
    return n;
}

// SentencePiece's normalizer over one raw fragment: with remove_extra_whitespaces, leading and
// trailing spaces go and runs of spaces become one; the space prefix comes first; every space
// is written as U+2581. Text of spaces only normalizes to nothing.
std::string normalize(const TokenizerState& s, std::string_view raw, bool add_prefix) {
    std::string sp, out;
    size_t i = 0;
    if (s.remove_extra_whitespaces) {
        while (i < raw.size()) {
            size_t n = normalizePrefix(s, raw, i, sp);
            if (sp != " ") break;
            i += n;
        }
    }
    if (i == raw.size()) return out;
    if (add_prefix) out += kSpace;
    bool prev_space = s.remove_extra_whitespaces;
    while (i < raw.size()) {
        i += normalizePrefix(s, raw, i, sp);
        std::string_view v = sp;
        if (prev_space)
            while (!v.empty() && v[0] == ' ') v.remove_prefix(1);
        if (v.empty()) continue;
        for (char c : v) {
            if (c == ' ') {
                out += kSpace;
            } else {
                out += c;
            }
        }
        prev_space = s.remove_extra_whitespaces && v.back() == ' ';
    }
    if (s.remove_extra_whitespaces)
        while (out.size() >= kSpace.size() && out.ends_with(kSpace))
            out.resize(out.size() - kSpace.size());
    return out;
}

}  // namespace

void ugmEncode(const TokenizerState& s, std::string_view raw, bool add_prefix,
               std::vector<int32_t>& out) {
    const std::string text = normalize(s, raw, add_prefix);
    const size_t n = text.size();
    struct Best {
        double score = -std::numeric_limits<double>::infinity();
        size_t start = 0;
        int32_t id = kNoToken;
    };
    std::vector<Best> best(n + 1);
    best[0].score = 0;
    const double unk_score = double(s.min_score) - kUnkPenalty;
    for (size_t i = 0; i < n; ++i) {
        if (best[i].score == -std::numeric_limits<double>::infinity()) continue;
        const size_t char_len = utf8CharLen(text, i);
        bool covered = false;
        for (size_t len = 1; len <= s.max_token_len && i + len <= n; ++len) {
            int32_t id = s.find(std::string_view(text).substr(i, len));
            if (id == kNoToken || s.types[size_t(id)] != TokenType::Normal) continue;
            covered |= len == char_len;
            double score = best[i].score + s.scores[size_t(id)];
            if (score > best[i + len].score) best[i + len] = {score, i, id};
        }
        if (!covered && best[i].score + unk_score > best[i + char_len].score)
            best[i + char_len] = {best[i].score + unk_score, i, s.unk};
    }
    std::vector<int32_t> ids;
    for (size_t end = n; end > 0; end = best[end].start) ids.push_back(best[end].id);
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
        if (*it == s.unk && !out.empty() && out.back() == s.unk && it != ids.rbegin()) continue;
        out.push_back(*it);
    }
}

}  // namespace blue
