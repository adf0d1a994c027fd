// Internals shared by the tokenizer's source files: the loaded vocabulary (TokenizerState), the
// per-algorithm encoders, GPT-2's byte-level alphabet and small UTF-8 helpers. Not part of the
// public API.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "compiler/pretokenize.h"
#include "compiler/tokenizer.h"

namespace blue {

struct TokenizerState {
    TokenizerModel model = TokenizerModel::Spm;
    std::string pre_name;

    std::vector<std::string> texts;   // [n_vocab] vocabulary text
    std::vector<float> scores;        // [n_vocab] SentencePiece merge priority (higher first)
    std::vector<TokenType> types;     // [n_vocab]
    std::vector<uint8_t> rstrip;      // [n_vocab] 1: whitespace after the special token is dropped
    std::vector<uint8_t> eog;         // [n_vocab] 1: end of generation
    std::vector<std::string> pieces;  // [n_vocab] decoded text, special tokens rendered
    std::unordered_map<std::string_view, int32_t> text_to_id;  // views into `texts`

    // BPE merges: mergeKey(left, right) -> rank (position in tokenizer.ggml.merges).
    std::unordered_map<std::string, int32_t> merge_rank;
    std::unique_ptr<PreTokenizer> pre;  // BPE only
    bool ignore_merges = false;         // BPE: a whole pre-token found in the vocabulary is kept

    size_t max_token_len = 0;  // [bytes] longest token text (WordPiece and Unigram matching)
    float min_score = 0;       // Unigram: lowest normal-token score (the unknown token's base)
    // WordPiece: continuations spelled "##piece" (Hugging Face) rather than word starts spelled
    // "\u2581piece" (llama.cpp's converter).
    bool wpm_hash_continuation = false;
    // Unigram: SentencePiece's precompiled character map, split into its double array and the
    // pool of replacement texts (NUL-terminated, indexed by the array's values).
    std::vector<uint32_t> charsmap_units;
    std::string charsmap_pool;
    bool remove_extra_whitespaces = false;  // Unigram

    // Token for each byte value: SPM <0xNN> (else the byte as text, else unk); BPE the byte's
    // byte-level character (else unk). Always a valid id (checked at load).
    std::array<int32_t, 256> byte_token{};

    // Control, user-defined and unknown tokens, longest text first: matched in raw text.
    std::vector<int32_t> special_by_length;

    // A control token decoded as text: Mistral's tool-call marker, [TOOL_CALLS], so an answer
    // shows (and structured output can require) where its calls start.
    int32_t shown_control = kNoToken;

    int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken;
    int32_t unk = kNoToken, pad = kNoToken, sep = kNoToken;
    bool add_bos = false, add_eos = false, add_space_prefix = false;
    bool add_sep = false;  // WordPiece: the separator token ends the sequence

    int32_t size() const { return int32_t(texts.size()); }
    int32_t find(std::string_view text) const {
        auto it = text_to_id.find(text);
        return it == text_to_id.end() ? kNoToken : it->second;
    }
};

// SentencePiece: tokenizes text whose spaces are already U+2581, appending ids to `out`.
void spmEncode(const TokenizerState& s, std::string_view text, std::vector<int32_t>& out);

// Byte-level BPE: tokenizes one pre-token (raw bytes), appending ids to `out`.
void bpeEncode(const TokenizerState& s, std::string_view word, std::vector<int32_t>& out);

// WordPiece: tokenizes one raw text fragment, appending ids to `out`.
void wpmEncode(const TokenizerState& s, std::string_view raw, std::vector<int32_t>& out);

// Unigram: normalizes one raw text fragment (with the space prefix when `add_prefix`) and
// tokenizes it, appending ids to `out`.
void ugmEncode(const TokenizerState& s, std::string_view raw, bool add_prefix,
               std::vector<int32_t>& out);

// The key of a merge pair in TokenizerState::merge_rank (unambiguous for any byte strings).
std::string mergeKey(std::string_view left, std::string_view right);

// GPT-2's byte-level alphabet: the UTF-8 text of the character that stands for byte b.
const std::string& byteLevelChar(uint8_t b);
// Maps byte-level text back to bytes; characters outside the alphabet are copied unchanged.
std::string byteLevelDecode(std::string_view text);

// Length of the UTF-8 sequence a lead byte starts (1 for ASCII, continuation and invalid bytes).
inline size_t utf8SeqLen(uint8_t lead) {
    if (lead < 0xC2) return 1;
    if (lead < 0xE0) return 2;
    if (lead < 0xF0) return 3;
    if (lead < 0xF5) return 4;
    return 1;
}

// Length of the character at s[off]: its UTF-8 sequence length when the continuation bytes are
// all there, else 1 (a stray or truncated byte stands alone).
inline size_t utf8CharLen(std::string_view s, size_t off) {
    size_t len = utf8SeqLen(uint8_t(s[off]));
    if (off + len > s.size()) return 1;
    for (size_t k = 1; k < len; ++k)
        if ((uint8_t(s[off + k]) & 0xC0) != 0x80) return 1;
    return len;
}

// Length of the longest prefix of `s` that does not end inside an incomplete UTF-8 sequence.
size_t utf8CompletePrefix(std::string_view s);

// The pair-merge loop both SentencePiece and BPE use: the text starts as characters (a doubly
// linked list of pieces); the adjacent pair with the highest priority merges (the leftmost among
// equals), and its new neighbours are ranked, until no ranked pair is left. The encoders differ
// only in how they rank a pair and turn the final pieces into ids.
class PairMerger {
  public:
    // `char_len(text, off)`: bytes of the character that starts at `off` (>= 1).
    template <class CharLen>
    PairMerger(std::string_view text, CharLen char_len) : text_(text) {
        for (size_t off = 0; off < text_.size();) {
            size_t len = char_len(text_, off);
            int32_t i = int32_t(pieces_.size());
            pieces_.push_back({i - 1, off + len == text_.size() ? -1 : i + 1, off, len});
            off += len;
        }
    }

    // `rank(left, right)`: the priority of merging two adjacent pieces (higher first), or nullopt
    // when they do not merge.
    template <class Rank>
    void merge(Rank rank) {
        auto push = [&](int32_t left, int32_t right) {
            if (left < 0 || right < 0) return;
            const Piece& l = pieces_[size_t(left)];
            const Piece& r = pieces_[size_t(right)];
            std::optional<double> p =
                rank(text_.substr(l.offset, l.len), text_.substr(r.offset, r.len));
            if (p) queue_.push({*p, left, right, l.len + r.len});
        };
        for (int32_t i = 1; i < int32_t(pieces_.size()); ++i) push(i - 1, i);
        while (!queue_.empty()) {
            Pair b = queue_.top();
            queue_.pop();
            Piece& l = pieces_[size_t(b.left)];
            Piece& r = pieces_[size_t(b.right)];
            // Stale: one side merged elsewhere since this pair was ranked.
            if (l.len == 0 || r.len == 0 || l.next != b.right || l.len + r.len != b.len) continue;
            l.len += r.len;
            r.len = 0;
            l.next = r.next;
            if (r.next >= 0) pieces_[size_t(r.next)].prev = b.left;
            push(l.prev, b.left);
            push(b.left, l.next);
        }
    }

    // Calls f(offset, length) for each piece, in text order.
    template <class F>
    void forEachPiece(F f) const {
        for (int32_t i = pieces_.empty() ? -1 : 0; i >= 0; i = pieces_[size_t(i)].next) {
            f(pieces_[size_t(i)].offset, pieces_[size_t(i)].len);
        }
    }

  private:
    struct Piece {
        int32_t prev, next;
        size_t offset, len;
    };
    struct Pair {
        double priority;
        int32_t left, right;
        size_t len;
        bool operator<(const Pair& o) const {  // priority_queue pops the "largest"
            return priority != o.priority ? priority < o.priority : left > o.left;
        }
    };
    std::string_view text_;
    std::vector<Piece> pieces_;
    std::priority_queue<Pair> queue_;
};

}  // namespace blue
