// Tokenizer: special-token partitioning, encode (dispatching text fragments to the SentencePiece
// or BPE encoder), decode, accessors, and the streaming decoder.
#include <cassert>

#include "compiler/tokenizer_internal.h"

namespace blue {
namespace {

constexpr std::string_view kSpmSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

struct Fragment {
    int32_t token;  // kNoToken: raw text
    size_t offset, len;
};

bool isAsciiSpace(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

// Splits `text` around occurrences of special-token text, longest tokens first (llama.cpp's
// order). Control and unknown tokens take part only when parse_special.
std::vector<Fragment> partitionSpecial(const TokenizerState& s, std::string_view text,
                                       bool parse_special) {
    std::vector<Fragment> frags, next;
    if (!text.empty()) frags.push_back({kNoToken, 0, text.size()});
    for (int32_t id : s.special_by_length) {
        TokenType type = s.types[size_t(id)];
        if (!parse_special && (type == TokenType::Control || type == TokenType::Unknown)) continue;
        const std::string& tt = s.texts[size_t(id)];
        if (text.find(tt) == std::string_view::npos) continue;
        next.clear();
        for (const Fragment& fr : frags) {
            if (fr.token != kNoToken) {
                next.push_back(fr);
                continue;
            }
            size_t pos = fr.offset, end = fr.offset + fr.len;
            for (size_t m; pos < end && (m = text.substr(0, end).find(tt, pos)) != text.npos;) {
                if (m > pos) next.push_back({kNoToken, pos, m - pos});
                next.push_back({id, m, tt.size()});
                pos = m + tt.size();
                if (s.rstrip[size_t(id)])
                    while (pos < end && isAsciiSpace(text[pos])) ++pos;
            }
            if (pos < end) next.push_back({kNoToken, pos, end - pos});
        }
        frags.swap(next);
    }
    return frags;
}

std::string escapeSpaces(std::string_view raw, bool add_prefix) {
    std::string out;
    out.reserve(raw.size() + 8);
    if (add_prefix) out += kSpmSpace;
    for (char c : raw) {
        if (c == ' ') {
            out += kSpmSpace;
        } else {
            out += c;
        }
    }
    return out;
}

}  // namespace

size_t utf8CompletePrefix(std::string_view s) {
    const size_t n = s.size();
    for (size_t back = 1; back <= 4 && back <= n; ++back) {
        uint8_t c = uint8_t(s[n - back]);
        if ((c & 0xC0) == 0x80) continue;
        return utf8SeqLen(c) > back ? n - back : n;
    }
    return n;
}

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(const Tokenizer&) = default;
Tokenizer& Tokenizer::operator=(const Tokenizer&) = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
    assert(s_ && "Tokenizer used before fromGguf");
    const TokenizerState& s = *s_;
    std::vector<int32_t> out;
    if (add_special && s.add_bos) out.push_back(s.bos);
    bool after_special = true;  // SentencePiece adds its space prefix at the start and after these
    std::vector<std::string_view> words;
    for (const Fragment& fr : partitionSpecial(s, text, parse_special)) {
        if (fr.token != kNoToken) {
            out.push_back(fr.token);
            after_special = true;
            continue;
        }
        std::string_view raw = text.substr(fr.offset, fr.len);
        if (s.model == TokenizerModel::Spm) {
            spmEncode(s, escapeSpaces(raw, s.add_space_prefix && after_special), out);
        } else if (s.model == TokenizerModel::Wpm) {
            wpmEncode(s, raw, out);
        } else if (s.model == TokenizerModel::Ugm) {
            ugmEncode(s, raw, s.add_space_prefix && after_special, out);
        } else {
            words.clear();
            s.pre->split(raw, words);
            for (std::string_view w : words) bpeEncode(s, w, out);
        }
        after_special = false;
    }
    if (add_special && s.add_eos) out.push_back(s.eos);
    if (add_special && s.add_sep) out.push_back(s.sep);
    return out;
}

bool Tokenizer::appendPiece(int32_t id, bool render_special, bool& strip_space,
                            std::string& out) const {
    if (!isValid(id)) return false;
    if (!render_special && hidden(id)) return false;
    std::string_view p = s_->pieces[size_t(id)];
    if (strip_space && !p.empty() && p[0] == ' ') p.remove_prefix(1);
    strip_space = false;
    out += p;
    return true;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
    assert(s_ && "Tokenizer used before fromGguf");
    std::string out;
    bool strip_space = s_->add_space_prefix;
    for (int32_t id : ids) appendPiece(id, render_special, strip_space, out);
    return out;
}

std::string_view Tokenizer::piece(int32_t id, bool render_special) const {
    if (!isValid(id)) return {};
    if (!render_special && hidden(id)) return {};
    return s_->pieces[size_t(id)];
}

TokenizerModel Tokenizer::model() const {
    return s_->model;
}
const std::string& Tokenizer::preTokenizer() const {
    return s_->pre_name;
}
int32_t Tokenizer::vocabSize() const {
    return s_ ? s_->size() : 0;
}
int32_t Tokenizer::bos() const {
    return s_->bos;
}
int32_t Tokenizer::eos() const {
    return s_->eos;
}
int32_t Tokenizer::eot() const {
    return s_->eot;
}
int32_t Tokenizer::eom() const {
    return s_->eom;
}
int32_t Tokenizer::unk() const {
    return s_->unk;
}
int32_t Tokenizer::pad() const {
    return s_->pad;
}
bool Tokenizer::addBos() const {
    return s_->add_bos;
}
bool Tokenizer::addEos() const {
    return s_->add_eos;
}
bool Tokenizer::addSpacePrefix() const {
    return s_->add_space_prefix;
}

bool Tokenizer::isEog(int32_t id) const {
    return isValid(id) && s_->eog[size_t(id)];
}

bool Tokenizer::hidden(int32_t id) const {
    const TokenType type = s_->types[size_t(id)];
    return (type == TokenType::Control && id != s_->shown_control) || type == TokenType::Unknown;
}

bool Tokenizer::isControl(int32_t id) const {
    return isValid(id) && s_->types[size_t(id)] == TokenType::Control;
}

TokenType Tokenizer::tokenType(int32_t id) const {
    return isValid(id) ? s_->types[size_t(id)] : TokenType::Undefined;
}

std::string_view Tokenizer::tokenText(int32_t id) const {
    return isValid(id) ? std::string_view(s_->texts[size_t(id)]) : std::string_view();
}

int32_t Tokenizer::findToken(std::string_view text) const {
    return s_ ? s_->find(text) : kNoToken;
}

std::vector<uint32_t> Tokenizer::promptIds(std::string_view text) const {
    std::vector<uint32_t> out;
    if (text.empty()) {
        if (bos() != kNoToken) out.push_back(uint32_t(bos()));
        return out;
    }
    for (int32_t id : encode(text, true, false)) out.push_back(uint32_t(id));
    return out;
}

TokenStreamDecoder::TokenStreamDecoder(const Tokenizer& tokenizer, bool render_special,
                                       bool at_sequence_start)
    : tokenizer_(&tokenizer),
      render_special_(render_special),
      strip_space_(at_sequence_start && tokenizer.addSpacePrefix()) {}

std::string TokenStreamDecoder::push(int32_t id) {
    if (!tokenizer_->appendPiece(id, render_special_, strip_space_, held_)) return {};
    size_t complete = utf8CompletePrefix(held_);
    std::string out = held_.substr(0, complete);
    held_.erase(0, complete);
    return out;
}

std::string TokenStreamDecoder::finish() {
    std::string out;
    out.swap(held_);
    return out;
}

}  // namespace blue
