// SentencePiece-style tokenization as llama.cpp does it: start from single characters, repeatedly
// merge the adjacent pair whose concatenation is the vocabulary token with the highest score (the
// leftmost pair among equals), then emit each final piece, or its bytes as <0xNN> tokens when the
// piece is not in the vocabulary. One difference, for invalid UTF-8 only: a byte that does not
// start a complete sequence is a character by itself, so it cannot swallow the next character.
#include "compiler/tokenizer_internal.h"

namespace blue {

void spmEncode(const TokenizerState& s, std::string_view text, std::vector<int32_t>& out) {
    PairMerger m(text, utf8CharLen);
    // The pair whose concatenation is the vocabulary token with the highest score merges first.
    m.merge([&](std::string_view left, std::string_view right) -> std::optional<double> {
        int32_t id = s.find(std::string_view(left.data(), left.size() + right.size()));
        if (id == kNoToken) return std::nullopt;
        return double(s.scores[size_t(id)]);
    });
    // Merged pieces are tokens by construction; only single characters can be missing: their
    // bytes become byte tokens.
    m.forEachPiece([&](size_t offset, size_t len) {
        int32_t id = s.find(text.substr(offset, len));
        if (id != kNoToken) {
            out.push_back(id);
            return;
        }
        for (size_t k = 0; k < len; ++k) out.push_back(s.byte_token[uint8_t(text[offset + k])]);
    });
}

}  // namespace blue
