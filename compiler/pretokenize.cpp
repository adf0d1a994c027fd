// Pre-tokenizers for byte-level BPE: the expression lists of each supported family (as published
// in the models' tokenizer.json files) and the ICU-based splitter.
#include "compiler/pretokenize.h"

#include <unicode/regex.h>
#include <unicode/unistr.h>

#include <cstdint>
#include <utility>

namespace blue {
namespace {

// Hugging Face's GPT-2 ByteLevel expression.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                               R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// CJK ideographs, Samaritan..CJK, Hangul: kept together by the DeepSeek tokenizers.
constexpr const char* kDeepseekCjk = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+";
// DeepSeek LLM's letter class: Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee and other
// cased scripts, listed as ranges in its tokenizer.json.
constexpr const char* kDeepseekLlmLetters =
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+";

struct Family {
    std::vector<const char*> names;
    std::vector<const char*> expressions;
    bool ignore_merges = false;
};

const std::vector<Family>& families() {
    static const std::vector<Family> kFamilies = {
        // llama.cpp's choice for BPE vocabularies that name no pre-tokenizer.
        {{"default"},
         {R"([\p{P}\$\+<=>\^~\|]+)",
          R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))", R"(\p{N}+)",
          R"([0-9][0-9][0-9])"}},
        {{"gpt2", "gpt-2", "phi-2"}, {kGpt2}},
        {{"llama3", "llama-v3", "llama-bpe"}, {kLlama3}, true},
        {{"qwen2", "deepseek-r1-qwen"}, {kQwen2}},
        {{"deepseek-coder"}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
        {{"deepseek-llm"},
         {"[\r\n]", kDeepseekLlmLetters,
          "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", R"(\s+$)",
          kDeepseekCjk, R"(\p{N}+)"}},
        {{"starcoder", "smollm"}, {R"(\p{N})", kGpt2}},
    };
    return kFamilies;
}

// `\s` / `\S` as Unicode White_Space (ICU's own \s leaves out U+000B and U+0085).
std::string withUnicodeWhitespace(std::string_view expr) {
    std::string out;
    for (size_t i = 0; i < expr.size(); ++i) {
        if (expr[i] == '\\' && i + 1 < expr.size()) {
            char c = expr[i + 1];
            if (c == 's' || c == 'S') {
                out += c == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
            } else {
                out += expr.substr(i, 2);
            }
            ++i;
            continue;
        }
        out += expr[i];
    }
    return out;
}

// Decodes one UTF-8 sequence at text[i]; an invalid or truncated one is U+FFFD of length 1.
std::pair<UChar32, size_t> decodeUtf8(std::string_view text, size_t i) {
    const auto b = [&](size_t k) { return uint8_t(text[k]); };
    uint8_t lead = b(i);
    if (lead < 0x80) return {lead, 1};
    size_t len = lead >= 0xC2 && lead < 0xE0   ? 2
                 : lead >= 0xE0 && lead < 0xF0 ? 3
                 : lead >= 0xF0 && lead < 0xF5 ? 4
                                               : 0;
    if (len == 0 || i + len > text.size()) return {0xFFFD, 1};
    UChar32 cp = lead & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
        if ((b(i + k) & 0xC0) != 0x80) return {0xFFFD, 1};
        cp = (cp << 6) | (b(i + k) & 0x3F);
    }
    static constexpr UChar32 kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0xFFFD, 1};
    return {cp, len};
}

}  // namespace

struct PreTokenizer::Impl {
    std::vector<std::unique_ptr<icu::RegexPattern>> patterns;
};

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string> PreTokenizer::supportedNames() {
    std::vector<std::string> names;
    for (const Family& f : families())
        for (const char* n : f.names) names.emplace_back(n);
    return names;
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::create(std::string_view name) {
    const Family* family = nullptr;
    for (const Family& f : families())
        for (const char* n : f.names)
            if (name == n) family = &f;
    if (!family) {
        std::string list;
        for (const std::string& n : supportedNames()) list += (list.empty() ? "" : ", ") + n;
        return BLUE_ERROR("pre-tokenizer '%s' is not supported (supported: %s)",
                          std::string(name).c_str(), list.c_str());
    }
    std::unique_ptr<PreTokenizer> p(new PreTokenizer());
    p->impl_ = std::make_unique<Impl>();
    p->ignore_merges_ = family->ignore_merges;
    for (const char* expr : family->expressions) {
        UErrorCode status = U_ZERO_ERROR;
        UParseError parse_error;
        icu::UnicodeString pattern = icu::UnicodeString::fromUTF8(withUnicodeWhitespace(expr));
        std::unique_ptr<icu::RegexPattern> compiled(
            icu::RegexPattern::compile(pattern, 0, parse_error, status));
        if (U_FAILURE(status) || !compiled) {
            return BLUE_ERROR("pre-tokenizer '%s': ICU rejected expression '%s': %s",
                              std::string(name).c_str(), expr, u_errorName(status));
        }
        p->impl_->patterns.push_back(std::move(compiled));
    }
    return p;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
    if (text.empty()) return;
    icu::UnicodeString u16;
    std::vector<size_t> byte_of_unit;  // [units + 1] byte offset where each UTF-16 unit starts
    byte_of_unit.reserve(text.size() + 1);
    for (size_t i = 0; i < text.size();) {
        auto [cp, len] = decodeUtf8(text, i);
        u16.append(cp);
        byte_of_unit.insert(byte_of_unit.end(), cp > 0xFFFF ? 2 : 1, i);
        i += len;
    }
    byte_of_unit.push_back(text.size());

    std::vector<std::pair<int32_t, int32_t>> pieces{{0, u16.length()}}, next;
    for (const auto& pattern : impl_->patterns) {
        UErrorCode status = U_ZERO_ERROR;
        std::unique_ptr<icu::RegexMatcher> m(pattern->matcher(u16, status));
        if (U_FAILURE(status) || !m) continue;  // out of memory: keep the coarser pieces
        next.clear();
        for (auto [begin, end] : pieces) {
            m->region(begin, end, status);
            int32_t pos = begin;
            while (U_SUCCESS(status) && m->find()) {
                int32_t ms = m->start(status), me = m->end(status);
                if (U_FAILURE(status) || me <= ms) continue;
                if (ms > pos) next.emplace_back(pos, ms);
                next.emplace_back(ms, me);
                pos = me;
            }
            if (pos < end) next.emplace_back(pos, end);
        }
        pieces.swap(next);
    }
    for (auto [begin, end] : pieces) {
        size_t b = byte_of_unit[size_t(begin)], e = byte_of_unit[size_t(end)];
        if (e > b) out.push_back(text.substr(b, e - b));
    }
}

}  // namespace blue
