// Byte-level BPE: GPT-2's byte-to-character alphabet and the merge loop that turns one
// pre-token into token ids (pairs merge lowest rank first, the leftmost pair among equals).
#include <cstring>

#include "compiler/tokenizer_internal.h"

namespace blue {
namespace {

// Bytes that are printable characters stand for themselves; the other 68 are moved, in byte
// order, to U+0100 and up, so every byte is a visible, non-space character.
struct ByteLevelAlphabet {
    std::array<std::string, 256> chars;
    std::unordered_map<uint32_t, uint8_t> byte_of;  // code point -> byte

    ByteLevelAlphabet() {
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            uint32_t cp = printable ? b : next++;
            byte_of[cp] = uint8_t(b);
            std::string& s = chars[b];
            if (cp < 0x80) {
                s += char(cp);
            } else {  // below U+0800: two bytes
                s += char(0xC0 | (cp >> 6));
                s += char(0x80 | (cp & 0x3F));
            }
        }
    }
};

const ByteLevelAlphabet& alphabet() {
    static const ByteLevelAlphabet kAlphabet;
    return kAlphabet;
}

}  // namespace

const std::string& byteLevelChar(uint8_t b) {
    return alphabet().chars[b];
}

std::string byteLevelDecode(std::string_view text) {
    const ByteLevelAlphabet& a = alphabet();
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        size_t len = std::min(utf8SeqLen(uint8_t(text[i])), text.size() - i);
        uint32_t cp = uint8_t(text[i]);
        bool one_char = cp < 0x80 || (len == 2 && (uint8_t(text[i + 1]) & 0xC0) == 0x80);
        if (len == 2) cp = ((cp & 0x1F) << 6) | (uint8_t(text[i + 1]) & 0x3F);
        auto it = one_char ? a.byte_of.find(cp) : a.byte_of.end();
        if (it != a.byte_of.end()) {
            out += char(it->second);
        } else {
            out.append(text.substr(i, len));
        }
        i += len;
    }
    return out;
}

std::string mergeKey(std::string_view left, std::string_view right) {
    std::string key;
    uint32_t n = uint32_t(left.size());
    key.resize(sizeof(n));
    std::memcpy(key.data(), &n, sizeof(n));
    key.append(left).append(right);
    return key;
}

void bpeEncode(const TokenizerState& s, std::string_view word, std::vector<int32_t>& out) {
    std::string text;
    text.reserve(word.size() * 2);
    for (char c : word) text += byteLevelChar(uint8_t(c));
    if (s.ignore_merges) {
        int32_t id = s.find(text);
        if (id != kNoToken) {
            out.push_back(id);
            return;
        }
    }
    PairMerger m(text, [](std::string_view t, size_t off) {
        return std::min(utf8SeqLen(uint8_t(t[off])), t.size() - off);
    });
    m.merge([&](std::string_view left, std::string_view right) -> std::optional<double> {
        auto it = s.merge_rank.find(mergeKey(left, right));
        if (it == s.merge_rank.end()) return std::nullopt;
        return -double(it->second);  // the lowest rank merges first
    });
    m.forEachPiece([&](size_t offset, size_t len) {
        std::string_view piece = std::string_view(text).substr(offset, len);
        int32_t id = s.find(piece);
        if (id != kNoToken) {
            out.push_back(id);
            return;
        }
        // A piece that is not a token (only in inconsistent vocabularies): its characters.
        for (size_t off = 0; off < piece.size();) {
            size_t n = std::min(utf8SeqLen(uint8_t(piece[off])), piece.size() - off);
            int32_t c = s.find(piece.substr(off, n));
            out.push_back(c != kNoToken ? c : s.unk);
            off += n;
        }
    });
}

}  // namespace blue
