// WordPiece (`tokenizer.ggml.model` = "bert"): BERT's basic tokenizer (NFD, lowercase, accents
// and control characters dropped, words cut at whitespace, punctuation, ASCII symbols and CJK
// ideographs each a word of its own), then greedy longest-match-first over each word. A word
// with a part no token covers, or longer than BERT's 100 characters, is the unknown token.
//
// Vocabularies come in two spellings: llama.cpp's converter writes word-initial pieces with a
// U+2581 prefix and continuations bare; Hugging Face's vocab.txt writes word-initial pieces bare
// and continuations with "##". Both are read (TokenizerState::wpm_hash_continuation).
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "compiler/tokenizer_internal.h"

namespace blue {
namespace {

constexpr size_t kMaxWordChars = 100;  // BERT's max_input_chars_per_word

bool isCjkIdeograph(UChar32 c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BERT's basic tokenizer. Invalid UTF-8 reads as U+FFFD, which is dropped like a control.
std::vector<std::string> basicWords(std::string_view raw) {
    UErrorCode status = U_ZERO_ERROR;
    icu::UnicodeString text =
        icu::UnicodeString::fromUTF8(icu::StringPiece(raw.data(), int32_t(raw.size())));
    const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
    if (U_SUCCESS(status)) text = nfd->normalize(text, status);
    std::vector<std::string> words(1);
    auto cut = [&]() {
        if (!words.back().empty()) words.emplace_back();
    };
    for (int32_t i = 0; i < text.length(); i = text.moveIndex32(i, 1)) {
        UChar32 c = text.char32At(i);
        int8_t type = u_charType(c);
        if (u_isUWhiteSpace(c)) {
            cut();
            continue;
        }
        bool control = type == U_CONTROL_CHAR || type == U_FORMAT_CHAR || type == U_SURROGATE ||
                       type == U_PRIVATE_USE_CHAR || type == U_UNASSIGNED;
        if (c == 0 || c == 0xFFFD || control || type == U_NON_SPACING_MARK) continue;
        c = u_tolower(c);
        bool symbol = type == U_MATH_SYMBOL || type == U_CURRENCY_SYMBOL ||
                      type == U_MODIFIER_SYMBOL || type == U_OTHER_SYMBOL;
        icu::UnicodeString one(c);
        std::string utf8;
        one.toUTF8String(utf8);
        if (u_ispunct(c) || (c < 0x7F && symbol) || isCjkIdeograph(c)) {
            cut();
            words.back() = utf8;
            words.emplace_back();
            continue;
        }
        words.back() += utf8;
    }
    if (words.back().empty()) words.pop_back();
    return words;
}

bool isCharStart(std::string_view s, size_t i) {
    return i == s.size() || (uint8_t(s[i]) & 0xC0) != 0x80;
}

// Greedy longest match over one word; false when some part has no token.
bool wordPieces(const TokenizerState& s, const std::string& word, std::vector<int32_t>& out) {
    const std::string_view cont = s.wpm_hash_continuation ? "##" : "";
    const std::string text = s.wpm_hash_continuation ? word : "\xe2\x96\x81" + word;
    std::string key;
    for (size_t i = 0; i < text.size();) {
        int32_t found = kNoToken;
        size_t j = std::min(text.size(), i + s.max_token_len);
        for (; j > i; --j) {
            if (!isCharStart(text, j)) continue;
            key.assign(i == 0 ? "" : cont);
            key.append(text, i, j - i);
            int32_t id = s.find(key);
            if (id != kNoToken && s.types[size_t(id)] == TokenType::Normal) {
                found = id;
                break;
            }
        }
        if (found == kNoToken) return false;
        out.push_back(found);
        i = j;
    }
    return true;
}

}  // namespace

void wpmEncode(const TokenizerState& s, std::string_view raw, std::vector<int32_t>& out) {
    for (const std::string& word : basicWords(raw)) {
        size_t mark = out.size();
        icu::UnicodeString u = icu::UnicodeString::fromUTF8(word);
        if (size_t(u.countChar32()) > kMaxWordChars || !wordPieces(s, word, out)) {
            out.resize(mark);
            out.push_back(s.unk);
        }
    }
}

}  // namespace blue
