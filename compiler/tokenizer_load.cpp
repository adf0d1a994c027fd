// Tokenizer::fromGguf: reads the tokenizer.ggml.* metadata, validates it, and derives what
// encoding and decoding need (lookup tables, byte tokens, special-token order, decoded pieces,
// end-of-generation tokens). Defaults follow llama.cpp where a key is absent.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compiler/tokenizer_internal.h"

namespace blue {
namespace {

constexpr const char* kKeyModel = "tokenizer.ggml.model";
constexpr const char* kKeyTokens = "tokenizer.ggml.tokens";
constexpr const char* kKeyScores = "tokenizer.ggml.scores";
constexpr const char* kKeyTypes = "tokenizer.ggml.token_type";
constexpr const char* kKeyMerges = "tokenizer.ggml.merges";
constexpr const char* kKeyPre = "tokenizer.ggml.pre";

// Tokens that end a turn, in the order llama.cpp picks an end-of-turn token among them.
constexpr const char* kEotTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",  // DeepSeek
};
constexpr const char* kEomText = "<|eom_id|>";
constexpr const char* kToolCallsText = "[TOOL_CALLS]";  // TokenizerState::shown_control

Status readTokens(const GgufFile& f, TokenizerState& s) {
    auto tokens = f.getStringArray(kKeyTokens);
    if (!tokens) return tokens.status();
    if (tokens->empty()) return BLUE_ERROR("%s: key '%s' is empty", f.name().c_str(), kKeyTokens);
    if (tokens->size() > size_t(INT32_MAX))
        return BLUE_ERROR("%s: key '%s' has too many tokens", f.name().c_str(), kKeyTokens);
    s.texts.assign(tokens->begin(), tokens->end());
    const size_t n = s.texts.size();
    s.text_to_id.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        if (s.texts[i].empty()) continue;  // can never match; decodes to nothing
        auto [it, inserted] = s.text_to_id.emplace(s.texts[i], int32_t(i));
        if (!inserted) {
            return BLUE_ERROR("%s: key '%s': token %zu duplicates token %d ('%s')",
                              f.name().c_str(), kKeyTokens, i, it->second,
                              ggufPrintable(s.texts[i]).c_str());
        }
    }
    s.scores.assign(n, 0.0f);
    if (f.has(kKeyScores)) {
        auto scores = f.getF32Array(kKeyScores);
        if (!scores) return scores.status();
        if (scores->size() != n)
            return BLUE_ERROR("%s: key '%s' has %zu entries, but '%s' has %zu", f.name().c_str(),
                              kKeyScores, scores->size(), kKeyTokens, n);
        for (size_t i = 0; i < n; ++i)
            if (std::isnan((*scores)[i]))
                return BLUE_ERROR("%s: key '%s': score of token %zu is NaN", f.name().c_str(),
                                  kKeyScores, i);
        s.scores = std::move(scores).value();
    }
    return {};
}

// "<0xNN>" -> NN; -1 for anything else.
int parseByteToken(std::string_view t) {
    auto hex = [](char c) {
        return c >= '0' && c <= '9'   ? c - '0'
               : c >= 'A' && c <= 'F' ? c - 'A' + 10
               : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                      : -1;
    };
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

Status readTypes(const GgufFile& f, TokenizerState& s) {
    const size_t n = s.texts.size();
    s.types.assign(n, TokenType::Normal);
    if (!f.has(kKeyTypes)) return {};
    auto types = f.getI32Array(kKeyTypes);
    if (!types) return types.status();
    if (types->size() != n)
        return BLUE_ERROR("%s: key '%s' has %zu entries, but '%s' has %zu", f.name().c_str(),
                          kKeyTypes, types->size(), kKeyTokens, n);
    for (size_t i = 0; i < n; ++i) {
        int32_t t = (*types)[i];
        if (t < 0 || t > int32_t(TokenType::Byte))
            return BLUE_ERROR("%s: key '%s': token %zu has type %d (expected 0..6)",
                              f.name().c_str(), kKeyTypes, i, t);
        s.types[i] = TokenType(t);
        if (s.types[i] == TokenType::Byte && parseByteToken(s.texts[i]) < 0)
            return BLUE_ERROR(
                "%s: key '%s': token %zu is a byte token but its text '%s' is not "
                "<0xNN>",
                f.name().c_str(), kKeyTypes, i, ggufPrintable(s.texts[i]).c_str());
    }
    return {};
}

Status readMerges(const GgufFile& f, TokenizerState& s) {
    auto merges = f.getStringArray(kKeyMerges);
    if (!merges) return merges.status();
    if (merges->size() > size_t(INT32_MAX))
        return BLUE_ERROR("%s: key '%s' has too many merges", f.name().c_str(), kKeyMerges);
    s.merge_rank.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
        std::string_view m = (*merges)[i];
        size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
        if (sp == std::string_view::npos || sp + 1 == m.size())
            return BLUE_ERROR(
                "%s: key '%s': merge %zu ('%s') is not two pieces separated by "
                "a space",
                f.name().c_str(), kKeyMerges, i, ggufPrintable(m).c_str());
        s.merge_rank.emplace(mergeKey(m.substr(0, sp), m.substr(sp + 1)), int32_t(i));
    }
    return {};
}

// Reads `tokenizer.ggml.<what>_token_id` into `id` when present: -1 and 0xFFFFFFFF (how
// converters write "none") give kNoToken; any other value must be a valid id.
Status readId(const GgufFile& f, const char* what, int32_t n_vocab, int32_t& id) {
    std::string key = std::string("tokenizer.ggml.") + what + "_token_id";
    const GgufValue* v = f.find(key);
    if (!v) return {};
    auto value = v->toI64();
    if (!value) return Status(value.status()).prefix(f.name() + ": key '" + key + "'");
    if (*value == -1 || *value == 0xFFFFFFFFll) {
        id = kNoToken;
        return {};
    }
    if (*value < 0 || *value >= n_vocab)
        return BLUE_ERROR("%s: key '%s' = %lld is outside the vocabulary (%d tokens)",
                          f.name().c_str(), key.c_str(), (long long)*value, n_vocab);
    id = int32_t(*value);
    return {};
}

Status readSpecialIds(const GgufFile& f, TokenizerState& s) {
    const bool spm = s.model == TokenizerModel::Spm;
    const bool wpm = s.model == TokenizerModel::Wpm, ugm = s.model == TokenizerModel::Ugm;
    struct Entry {
        const char* what;
        int32_t* id;
        int32_t fallback;  // llama.cpp's default when the key is absent
    };
    const Entry entries[] = {
        {"bos", &s.bos,
         spm   ? 1
         : wpm ? 101
               : kNoToken},
        {"eos", &s.eos,
         spm   ? 2
         : ugm ? 1
               : kNoToken},
        {"unknown", &s.unk,
         spm   ? 0
         : wpm ? 100
         : ugm ? 2
               : kNoToken},
        {"seperator", &s.sep, wpm ? 102 : kNoToken},
        {"padding", &s.pad, wpm || ugm ? 0 : kNoToken},
        {"eot", &s.eot, kNoToken},
        {"eom", &s.eom, kNoToken},
    };
    for (const Entry& e : entries) {
        *e.id = e.fallback < s.size() ? e.fallback : kNoToken;
        BLUE_TRY(readId(f, e.what, s.size(), *e.id));
    }
    return {};
}

Status readFlags(const GgufFile& f, TokenizerState& s) {
    const bool spm = s.model == TokenizerModel::Spm;
    const bool wpm = s.model == TokenizerModel::Wpm, ugm = s.model == TokenizerModel::Ugm;
    bool family_bos = s.pre && s.pre->addBos();
    auto bos = f.getBoolOr("tokenizer.ggml.add_bos_token", spm || wpm || family_bos);
    auto eos = f.getBoolOr("tokenizer.ggml.add_eos_token", ugm);
    bool family_sep = s.pre && s.pre->addSep();
    auto sep = f.getBoolOr("tokenizer.ggml.add_sep_token", wpm || family_sep);
    auto space = f.getBoolOr("tokenizer.ggml.add_space_prefix", spm || ugm);
    auto extra = f.getBoolOr("tokenizer.ggml.remove_extra_whitespaces", false);
    if (!bos) return bos.status();
    if (!eos) return eos.status();
    if (!sep) return sep.status();
    if (!space) return space.status();
    if (!extra) return extra.status();
    s.add_bos = *bos;
    s.add_eos = *eos;
    s.add_sep = s.model != TokenizerModel::Spm && s.model != TokenizerModel::Ugm && *sep;
    // BPE vocabularies carry spaces in their pre-tokens; WordPiece words start with a space when
    // decoded (dropped at the start of the text, as the SentencePiece prefix is).
    s.add_space_prefix = ((spm || ugm) && *space) || wpm;
    s.remove_extra_whitespaces = ugm && *extra;
    if (s.add_sep && s.sep == kNoToken)
        return BLUE_ERROR(
            "%s: 'tokenizer.ggml.add_sep_token' is true but the vocabulary has no "
            "separator token",
            f.name().c_str());
    if (s.add_bos && s.bos == kNoToken)
        return BLUE_ERROR(
            "%s: 'tokenizer.ggml.add_bos_token' is true but the vocabulary has no "
            "BOS token",
            f.name().c_str());
    if (s.add_eos && s.eos == kNoToken)
        return BLUE_ERROR(
            "%s: 'tokenizer.ggml.add_eos_token' is true but the vocabulary has no "
            "EOS token",
            f.name().c_str());
    return {};
}

Status buildByteTokens(const GgufFile& f, TokenizerState& s) {
    for (int b = 0; b < 256; ++b) {
        int32_t id = kNoToken;
        if (s.model != TokenizerModel::Bpe) {
            char hex[8];
            std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
            id = s.find(hex);
            if (id == kNoToken) id = s.find(std::string(1, char(b)));
        } else {
            id = s.find(byteLevelChar(uint8_t(b)));
        }
        if (id == kNoToken) id = s.unk;
        if (id == kNoToken)
            return BLUE_ERROR(
                "%s: key '%s': the vocabulary has no token for byte 0x%02X and no "
                "unknown token to stand for it",
                f.name().c_str(), kKeyTokens, b);
        s.byte_token[size_t(b)] = id;
    }
    return {};
}

// End-of-turn tokens found by their text end generation and are treated as control tokens (as in
// llama.cpp: converters sometimes leave them typed normal); so do eos, eot and eom.
void findEndTokens(TokenizerState& s) {
    s.eog.assign(s.texts.size(), 0);
    auto mark = [&](int32_t id) {
        s.eog[size_t(id)] = 1;
        if (s.types[size_t(id)] != TokenType::Control) s.types[size_t(id)] = TokenType::Control;
    };
    for (const char* text : kEotTexts) {
        int32_t id = s.find(text);
        if (id == kNoToken) continue;
        if (s.eot == kNoToken) s.eot = id;
        mark(id);
    }
    int32_t eom = s.find(kEomText);
    if (eom != kNoToken) {
        if (s.eom == kNoToken) s.eom = eom;
        mark(eom);
    }
    for (int32_t id : {s.eos, s.eot, s.eom})
        if (id != kNoToken) s.eog[size_t(id)] = 1;
    const int32_t calls = s.find(kToolCallsText);
    if (calls != kNoToken && s.types[size_t(calls)] == TokenType::Control && !s.eog[size_t(calls)]) {
        s.shown_control = calls;
    }
}

void buildSpecialOrder(TokenizerState& s) {
    for (int32_t id = 0; id < s.size(); ++id) {
        TokenType t = s.types[size_t(id)];
        bool special =
            t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
        if (special && !s.texts[size_t(id)].empty()) s.special_by_length.push_back(id);
    }
    std::stable_sort(s.special_by_length.begin(), s.special_by_length.end(),
                     [&](int32_t a, int32_t b) {
                         return s.texts[size_t(a)].size() > s.texts[size_t(b)].size();
                     });
}

std::string decodedPiece(const TokenizerState& s, int32_t id) {
    const std::string& text = s.texts[size_t(id)];
    switch (s.types[size_t(id)]) {
        case TokenType::Normal: {
            if (s.model == TokenizerModel::Bpe) return byteLevelDecode(text);
            if (s.model == TokenizerModel::Wpm && s.wpm_hash_continuation)
                return text.starts_with("##") ? text.substr(2) : " " + text;
            std::string out;
            for (size_t i = 0; i < text.size(); ++i) {
                if (text.compare(i, 3, "\xe2\x96\x81") == 0) {
                    out += ' ';
                    i += 2;
                } else {
                    out += text[i];
                }
            }
            return out;
        }
        case TokenType::Byte:
            return std::string(1, char(parseByteToken(text)));
        case TokenType::Control:
        case TokenType::Unknown:
        case TokenType::UserDefined:
            return text;
        default:
            return {};
    }
}

// Phi-3's special tokens swallow the whitespace after them (llama.cpp keys this on the name).
void applyNameRules(const GgufFile& f, TokenizerState& s) {
    s.rstrip.assign(s.texts.size(), 0);
    auto name_value = f.getStringOr("general.name", "");
    std::string name = name_value ? std::string(*name_value) : std::string();
    std::transform(name.begin(), name.end(), name.begin(),
                   [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; });
    if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
    for (int32_t id : s.special_by_length) s.rstrip[size_t(id)] = 1;
    for (const char* text : {"<unk>", "<s>", "<|endoftext|>"}) {
        int32_t id = s.find(text);
        if (id != kNoToken) s.rstrip[size_t(id)] = 0;
    }
}

Status readModel(const GgufFile& f, TokenizerState& s) {
    auto model = f.getString(kKeyModel);
    if (!model) return model.status();
    if (*model == "llama") {
        s.model = TokenizerModel::Spm;
    } else if (*model == "gpt2") {
        s.model = TokenizerModel::Bpe;
    } else if (*model == "bert") {
        s.model = TokenizerModel::Wpm;
    } else if (*model == "t5") {
        s.model = TokenizerModel::Ugm;
    } else {
        return BLUE_ERROR(
            "%s: key '%s': tokenizer model '%s' is not supported (supported: "
            "'llama' = SentencePiece, 'gpt2' = byte-level BPE, 'bert' = WordPiece, 't5' = "
            "Unigram)",
            f.name().c_str(), kKeyModel, ggufPrintable(*model).c_str());
    }
    return {};
}

Status readBpe(const GgufFile& f, TokenizerState& s) {
    BLUE_TRY(readMerges(f, s));
    auto pre = f.getStringOr(kKeyPre, "default");
    if (!pre) return pre.status();
    s.pre_name = std::string(*pre);
    auto created = PreTokenizer::create(s.pre_name);
    if (!created) return Status(created.status()).prefix(f.name() + ": key '" + kKeyPre + "'");
    s.pre = std::move(created).value();
    s.ignore_merges = s.pre->ignoreMerges();
    return {};
}

// SentencePiece's precompiled character map: a little-endian u32 size of the double array, the
// array's units, then the pool of NUL-terminated replacement texts.
Status readCharsmap(const GgufFile& f, TokenizerState& s) {
    constexpr const char* kKey = "tokenizer.ggml.precompiled_charsmap";
    if (!f.has(kKey)) return {};
    auto bytes = f.getI32Array(kKey);
    if (!bytes) return bytes.status();
    if (bytes->empty()) return {};
    auto byte = [&](size_t i) { return uint8_t((*bytes)[i]); };
    if (bytes->size() < 4)
        return BLUE_ERROR("%s: key '%s' is shorter than its header", f.name().c_str(), kKey);
    size_t array_bytes =
        size_t(byte(0)) | size_t(byte(1)) << 8 | size_t(byte(2)) << 16 | size_t(byte(3)) << 24;
    if (array_bytes % 4 != 0 || array_bytes > bytes->size() - 4)
        return BLUE_ERROR("%s: key '%s': double array of %zu bytes does not fit in %zu",
                          f.name().c_str(), kKey, array_bytes, bytes->size());
    s.charsmap_units.resize(array_bytes / 4);
    for (size_t u = 0; u < s.charsmap_units.size(); ++u) {
        size_t b = 4 + 4 * u;
        s.charsmap_units[u] = uint32_t(byte(b)) | uint32_t(byte(b + 1)) << 8 |
                              uint32_t(byte(b + 2)) << 16 | uint32_t(byte(b + 3)) << 24;
    }
    for (size_t i = 4 + array_bytes; i < bytes->size(); ++i) s.charsmap_pool += char(byte(i));
    s.charsmap_pool += '\0';  // every value indexes a terminated string
    return {};
}

// What WordPiece and Unigram matching need: the longest token, the lowest score, the spelling.
void findMatchLimits(TokenizerState& s) {
    bool hash = false, marker = false;
    s.min_score = 0;
    bool first = true;
    for (int32_t id = 0; id < s.size(); ++id) {
        const std::string& t = s.texts[size_t(id)];
        s.max_token_len = std::max(s.max_token_len, t.size());
        if (s.types[size_t(id)] != TokenType::Normal) continue;
        hash |= t.size() > 2 && t.starts_with("##");
        marker |= t.starts_with("\xe2\x96\x81");
        if (first || s.scores[size_t(id)] < s.min_score) s.min_score = s.scores[size_t(id)];
        first = false;
    }
    s.wpm_hash_continuation = hash && !marker;
}

}  // namespace

Result<Tokenizer> Tokenizer::fromGguf(const GgufFile& f) {
    auto s = std::make_shared<TokenizerState>();
    BLUE_TRY(readModel(f, *s));
    BLUE_TRY(readTokens(f, *s));
    BLUE_TRY(readTypes(f, *s));
    if (s->model == TokenizerModel::Bpe) BLUE_TRY(readBpe(f, *s));
    if (s->model == TokenizerModel::Ugm) BLUE_TRY(readCharsmap(f, *s));
    findMatchLimits(*s);
    BLUE_TRY(readSpecialIds(f, *s));
    BLUE_TRY(readFlags(f, *s));
    BLUE_TRY(buildByteTokens(f, *s));
    findEndTokens(*s);
    buildSpecialOrder(*s);
    applyNameRules(f, *s);
    s->pieces.resize(s->texts.size());
    for (int32_t id = 0; id < s->size(); ++id) s->pieces[size_t(id)] = decodedPiece(*s, id);
    Tokenizer t;
    t.s_ = std::move(s);
    return t;
}

}  // namespace blue
