// Byte-level BPE: GPT-2's byte-to-character alphabet and the merge loop that turns one
// pre-token into token ids (pairs merge lowest rank first, the leftmost pair among equals).
#include <cstring>
#include <queue>

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

struct Symbol {
    int32_t prev, next;
    size_t offset, len;  // bytes of the byte-level text
};

struct Bigram {
    int32_t rank;
    int32_t left, right;
    size_t len;
    bool operator<(const Bigram& o) const {  // priority_queue pops the "largest"
        return rank != o.rank ? rank > o.rank : left > o.left;
    }
};

class BpeWord {
  public:
    BpeWord(const TokenizerState& s, std::string text) : s_(s), text_(std::move(text)) {
        for (size_t off = 0; off < text_.size();) {
            size_t len = std::min(utf8SeqLen(uint8_t(text_[off])), text_.size() - off);
            int32_t i = int32_t(symbols_.size());
            symbols_.push_back({i - 1, off + len == text_.size() ? -1 : i + 1, off, len});
            off += len;
        }
    }

    void merge() {
        for (int32_t i = 1; i < int32_t(symbols_.size()); ++i) addBigram(i - 1, i);
        while (!queue_.empty()) {
            Bigram b = queue_.top();
            queue_.pop();
            Symbol& l = symbols_[size_t(b.left)];
            Symbol& r = symbols_[size_t(b.right)];
            if (l.len == 0 || r.len == 0 || l.next != b.right || l.len + r.len != b.len) continue;
            l.len += r.len;
            r.len = 0;
            l.next = r.next;
            if (r.next >= 0) symbols_[size_t(r.next)].prev = b.left;
            addBigram(l.prev, b.left);
            addBigram(b.left, l.next);
        }
    }

    void emit(std::vector<int32_t>& out) const {
        for (int32_t i = symbols_.empty() ? -1 : 0; i >= 0; i = symbols_[size_t(i)].next) {
            const Symbol& sym = symbols_[size_t(i)];
            int32_t id = s_.find(std::string_view(text_).substr(sym.offset, sym.len));
            if (id != kNoToken) {
                out.push_back(id);
                continue;
            }
            // A symbol that is not a token (only in inconsistent vocabularies): its characters.
            for (size_t off = sym.offset; off < sym.offset + sym.len;) {
                size_t len = std::min(utf8SeqLen(uint8_t(text_[off])), sym.offset + sym.len - off);
                int32_t c = s_.find(std::string_view(text_).substr(off, len));
                out.push_back(c != kNoToken ? c : s_.unk);
                off += len;
            }
        }
    }

  private:
    void addBigram(int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const Symbol& l = symbols_[size_t(left)];
        const Symbol& r = symbols_[size_t(right)];
        std::string_view t(text_);
        auto it =
            s_.merge_rank.find(mergeKey(t.substr(l.offset, l.len), t.substr(r.offset, r.len)));
        if (it == s_.merge_rank.end()) return;
        queue_.push({it->second, left, right, l.len + r.len});
    }

    const TokenizerState& s_;
    std::string text_;
    std::vector<Symbol> symbols_;
    std::priority_queue<Bigram> queue_;
};

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
    BpeWord w(s, std::move(text));
    w.merge();
    w.emit(out);
}

}  // namespace blue
