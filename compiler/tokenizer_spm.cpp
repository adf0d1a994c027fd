// SentencePiece-style tokenization as llama.cpp does it: start from single characters, repeatedly
// merge the adjacent pair whose concatenation is the vocabulary token with the highest score (the
// leftmost pair among equals), then emit each final piece, or its bytes as <0xNN> tokens when the
// piece is not in the vocabulary. One difference, for invalid UTF-8 only: a byte that does not
// start a complete sequence is a character by itself, so it cannot swallow the next character.
#include <queue>

#include "compiler/tokenizer_internal.h"

namespace blue {
namespace {

struct Symbol {
    int32_t prev, next;
    size_t offset, len;  // bytes of the text
};

struct Bigram {
    float score;
    int32_t left, right;
    size_t len;
    bool operator<(const Bigram& o) const {  // priority_queue pops the "largest"
        return score != o.score ? score < o.score : left > o.left;
    }
};

class SpmText {
  public:
    SpmText(const TokenizerState& s, std::string_view text) : s_(s), text_(text) {
        for (size_t off = 0; off < text_.size();) {
            size_t len = utf8CharLen(text_, off);
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

    // Merged pieces are tokens by construction; only single characters can be missing.
    void emit(std::vector<int32_t>& out) const {
        for (int32_t i = symbols_.empty() ? -1 : 0; i >= 0; i = symbols_[size_t(i)].next) {
            const Symbol& sym = symbols_[size_t(i)];
            int32_t id = s_.find(text_.substr(sym.offset, sym.len));
            if (id != kNoToken) {
                out.push_back(id);
                continue;
            }
            for (size_t k = 0; k < sym.len; ++k)
                out.push_back(s_.byte_token[uint8_t(text_[sym.offset + k])]);
        }
    }

  private:
    void addBigram(int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const Symbol& l = symbols_[size_t(left)];
        const Symbol& r = symbols_[size_t(right)];
        int32_t id = s_.find(text_.substr(l.offset, l.len + r.len));
        if (id == kNoToken) return;
        queue_.push({s_.scores[size_t(id)], left, right, l.len + r.len});
    }

    const TokenizerState& s_;
    std::string_view text_;
    std::vector<Symbol> symbols_;
    std::priority_queue<Bigram> queue_;
};

}  // namespace

void spmEncode(const TokenizerState& s, std::string_view text, std::vector<int32_t>& out) {
    SpmText t(s, text);
    t.merge();
    t.emit(out);
}

}  // namespace blue
