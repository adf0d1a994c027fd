// Pre-tokenizers for byte-level BPE: the expression lists of every family llama.cpp knows by a
// `tokenizer.ggml.pre` name (as published in the models' tokenizer.json files) and the ICU-based
// splitter.
#include "compiler/pretokenize.h"

#include <unicode/regex.h>
#include <unicode/unistr.h>

#include <cstdint>
#include <utility>

namespace blue {
namespace {

// The published expressions. `\s` is Unicode White_Space (see withUnicodeWhitespace); ICU takes
// the originals as written, case-insensitive groups, possessive quantifiers and set differences
// included, so no expression here needed rewriting for a weaker regex engine.

// GPT-2's ByteLevel expression (Hugging Face's form, with the final `\s+`).
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 / cl100k: case-insensitive contractions, digits in threes.
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: as Llama 3 with single digits.
constexpr const char* kQwen2 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                               R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen3.5: combining marks (\p{M}) stay with the letters they modify.
constexpr const char* kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N})"
    R"(| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Seed-Coder: single digits; a punctuation run does not take the line breaks after it.
constexpr const char* kSeedCoder =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1})"
    R"(| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Ling / Bailing MoE: Qwen2's rules written with possessive quantifiers; `\s*[\r\n]` still ends
// at the last line break of a whitespace run, as `[\r\n]+` does.
constexpr const char* kBailing = R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N})"
                                 R"(| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
// Tekken (Mistral Nemo): words split at a lower-to-upper case change; single digits; `/` joins
// the line breaks after a symbol run.
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-4o / o200k: as Tekken, contractions kept on the word, digits in threes.
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Kimi K2: Han runs on their own; otherwise o200k's words with Han left out of the letter
// classes (set difference, `--`), and only line breaks (no `/`) after a symbol run.
constexpr const char* kKimiK2 =
    R"(\p{Han}+)"
    R"(|[^\r\n\p{L}\p{N}]?[[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]--\p{Han}]*)"
    R"([[\p{Ll}\p{Lm}\p{Lo}\p{M}]--\p{Han}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]--\p{Han}]+)"
    R"([[\p{Ll}\p{Lm}\p{Lo}\p{M}]--\p{Han}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek V3's last step (also AFMoE's): an ASCII punctuation mark leads an ASCII word; letters
// keep their combining marks; symbols (\p{S}) group with punctuation.
constexpr const char* kDeepseekV3Words =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
    R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// BLOOM and its descendants: a word is everything up to whitespace or one of these marks (the
// parentheses and `|` are literal members of the class, as published).
constexpr const char* kBloom = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+";
// CJK ideographs, Samaritan..CJK, Hangul: kept together by the DeepSeek tokenizers.
constexpr const char* kDeepseekCjk = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+";
// AFMoE's Asian-script runs: CJK (with extension A and compatibility ideographs), kana,
// half-width kana, Kangxi radicals, Thai, Lao, Khmer, Myanmar, Hangul and Hangul Jamo.
constexpr const char* kAfmoeScripts =
    "[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f"
    "\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f"
    "\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+";
// AFMoE's digit grouping: a run of digits is cut into threes counted from its end, so the first
// piece takes the remainder ("12345" -> "12" "345").
constexpr const char* kDigitsFromEnd = R"(\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N})))";

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
    std::vector<const char*> names;  // tokenizer.ggml.pre values, the first one canonical
    std::vector<const char*> expressions;
    bool ignore_merges = false;  // a whole pre-token that is a token is kept as it is
    bool add_bos = false;        // BOS is added unless tokenizer.ggml.add_bos_token says not
    bool add_sep = false;  // SEP ends the sequence unless tokenizer.ggml.add_sep_token says not
};

// Every pre-tokenizer llama.cpp names in tokenizer.ggml.pre, grouped by behaviour.
const std::vector<Family>& families() {
    static const std::vector<Family> kFamilies = {
        // llama.cpp's choice for BPE vocabularies that name no pre-tokenizer.
        {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
        {{"gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "jina-es",
          "jina-de", "jina-v2-es", "jina-v2-de", "gigachat", "a.x-4.0", "mellum", "exaone4",
          "modern-bert"},
         {kGpt2}},
        // GPT-2's expression for encoder models that end a sequence with SEP.
        {{"jina-v1-en", "jina-v2-code", "roberta-bpe"}, {kGpt2}, false, false, true},
        {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
          "jina-v5-nano"},
         {kLlama3},
         true,
         true},
        // Llama 3's expression without its whole-word rule.
        {{"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}, {kLlama3}},
        {{"qwen2", "deepseek-r1-qwen", "megrez", "kormo", "f2llmv2", "stablelm2", "hunyuan",
          "grok-2", "solar-open"},
         {kQwen2}},
        {{"qwen35"}, {kQwen35}},
        {{"deepseek-coder"}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
        {{"deepseek-llm"},
         {"[\r\n]", kDeepseekLlmLetters,
          "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", R"(\s+$)",
          kDeepseekCjk, R"(\p{N}+)"}},
        {{"deepseek-v3", "hunyuan-dense", "joyai-llm"},
         {R"(\p{N}{1,3})", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", kDeepseekV3Words}},
        {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
        {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
         {R"(\p{N})", kGpt2}},
        {{"bloom", "poro-chat", "gpt3-finnish"}, {kBloom}},
        {{"viking"}, {kBloom, R"(\p{N})"}},
        {{"tekken"}, {kTekken}, true, true},
        {{"chameleon"},
         {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\t\n]|    |  )",
          R"(\p{N})", R"([\p{P}!-/:-@\[-`{-~])", kGpt2},
         false,
         true},
        {{"gpt-4o", "llama4", "minimax-m2", "kanana2", "talkie"}, {kGpt4o}},
        {{"kimi-k2"}, {kKimiK2}},
        // SuperBPE: no word boundaries at all (tokens may span spaces); digit runs alone, cut
        // into threes from the end by a zero-width match.
        {{"superbpe"}, {R"(\p{N}+)", R"((?=(\d{3})+(?!\d)))"}},
        {{"bailingmoe", "bailingmoe2", "llada-moe"}, {kBailing}},
        {{"seed-coder"}, {kSeedCoder}},
        {{"afmoe"}, {kDigitsFromEnd, kAfmoeScripts, kDeepseekV3Words}},
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
    p->add_bos_ = family->add_bos;
    p->add_sep_ = family->add_sep;
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
                if (U_FAILURE(status)) break;
                if (me == ms) {  // an empty match only marks a cut (SuperBPE's digit groups)
                    if (ms > pos && ms < end) next.emplace_back(pos, ms), pos = ms;
                    continue;
                }
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
