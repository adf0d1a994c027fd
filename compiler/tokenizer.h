// Tokenizers read from GGUF metadata: SentencePiece-style (`tokenizer.ggml.model` = "llama"),
// byte-level BPE ("gpt2") with the pre-tokenizer named by `tokenizer.ggml.pre`, WordPiece
// ("bert") and Unigram ("t5"); special tokens, batch and streaming detokenization.
//
// Behaviour follows llama.cpp's tokenizer so token ids interoperate with llama.cpp and the
// reference tokenizers it is tested against:
// - SentencePiece: spaces become U+2581, a leading space is added to the first text fragment (and
//   after each special token) when add_space_prefix is set, pieces merge by score, and characters
//   with no token fall back to <0xNN> byte tokens.
// - BPE: the text is split by the pre-tokenizer's regular expressions (ICU, so Unicode categories
//   are right for all of Unicode), each piece is mapped to GPT-2's byte-level alphabet and merged
//   by merge rank.
// - WordPiece: BERT's basic tokenizer, then greedy longest-match-first per word
// (tokenizer_wpm.cpp).
// - Unigram: SentencePiece's normalizer, then Viterbi over piece scores (tokenizer_ugm.cpp).
// - Special-token text (<|im_start|>, </s>, ...) is recognised before either algorithm runs:
//   user-defined tokens always, control tokens only when asked (parse_special).
//
// A Tokenizer owns copies of everything it needs (it does not keep the GgufFile alive), is
// immutable after loading, cheap to copy (shared state) and safe to use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/gguf.h"
#include "vm/status.h"

namespace blue {

constexpr int32_t kNoToken = -1;

// "llama" = SentencePiece, "gpt2" = byte-level BPE, "bert" = WordPiece, "t5" = Unigram.
enum class TokenizerModel { Spm, Bpe, Wpm, Ugm };

// Token types as numbered in `tokenizer.ggml.token_type` (llama.cpp's llama_token_type).
enum class TokenType : uint8_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
};

struct TokenizerState;

class Tokenizer {
  public:
    Tokenizer();
    ~Tokenizer();
    Tokenizer(const Tokenizer&);
    Tokenizer& operator=(const Tokenizer&);
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;

    // Reads and validates the vocabulary: model type, tokens, scores, token types, merges, special
    // token ids, add_bos/add_eos/add_space_prefix flags and the pre-tokenizer. Fails with a message
    // naming the file and the key (and index) on a missing or mistyped key, arrays of inconsistent
    // lengths, an id out of range, a merge without a separator, a malformed byte token, duplicate
    // token text, or an unsupported model or pre-tokenizer.
    static Result<Tokenizer> fromGguf(const GgufFile& file);

    // Text to token ids. add_special: add BOS/EOS as the vocabulary's add_bos/add_eos flags say.
    // parse_special: turn control-token text such as "<|im_start|>" into that token (user-defined
    // tokens are always recognised). Any byte string is accepted; invalid UTF-8 becomes byte
    // tokens (or the unknown token where the vocabulary has no byte tokens).
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

    // Token ids to text, the exact bytes of the pieces concatenated. With add_space_prefix
    // (SentencePiece), one leading space of the first text-producing token is dropped, as the
    // SentencePiece decoder does; BOS and other hidden control tokens before it do not count.
    // render_special: include the text of control and unknown tokens (Mistral's [TOOL_CALLS] is
    // always included: see hidden()). Ids outside the vocabulary
    // produce nothing. No clean-up of tokenization spaces is applied, so decoding is lossless and
    // equals streaming decoding.
    std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

    // The text a token contributes when decoded (spaces restored, bytes unmapped); empty for ids
    // outside the vocabulary and for hidden control/unknown tokens unless render_special.
    std::string_view piece(int32_t id, bool render_special = false) const;

    TokenizerModel model() const;
    const std::string& preTokenizer() const;  // BPE: as in tokenizer.ggml.pre; SPM: ""
    int32_t vocabSize() const;
    int32_t bos() const;  // kNoToken when the vocabulary has none
    int32_t eos() const;
    int32_t eot() const;  // end of turn: tokenizer.ggml.eot_token_id or found by text
    int32_t eom() const;
    int32_t unk() const;
    int32_t pad() const;
    bool addBos() const;
    bool addEos() const;
    bool addSpacePrefix() const;

    bool isValid(int32_t id) const { return id >= 0 && id < vocabSize(); }
    // End of generation: eos, eot, eom and turn-ending tokens such as <|im_end|>, <|eot_id|>,
    // <|end|>, <end_of_turn>. False for ids outside the vocabulary.
    bool isEog(int32_t id) const;
    bool isControl(int32_t id) const;
    TokenType tokenType(int32_t id) const;  // Undefined for ids outside the vocabulary
    // The token's text as stored in the vocabulary ("▁Hello", "Ġworld", "<0x0A>"); empty for ids
    // outside the vocabulary.
    std::string_view tokenText(int32_t id) const;
    // The id whose vocabulary text is exactly `text`, or kNoToken.
    int32_t findToken(std::string_view text) const;
    // A prompt's ids: BOS as the vocabulary asks, then the text (special-token text stays text);
    // an empty prompt gives just BOS.
    std::vector<uint32_t> promptIds(std::string_view text) const;

  private:
    friend class TokenStreamDecoder;
    // Appends the text of `id` to `out` for decoding: nothing for invalid ids and hidden special
    // tokens (returns false, leaving strip_space as is); otherwise drops one leading space when
    // strip_space is set, then clears it.
    bool appendPiece(int32_t id, bool render_special, bool& strip_space, std::string& out) const;
    // Whether decoding leaves `id` out unless render_special: control and unknown tokens, except
    // Mistral's [TOOL_CALLS], which answers show so they read back as tool calls. `id` is valid.
    bool hidden(int32_t id) const;

    std::shared_ptr<const TokenizerState> s_;
};

// Turns tokens into UTF-8 text one token at a time, as they are generated. A multi-byte character
// split across tokens (byte-fallback tokens, byte-level BPE pieces) is held back until it is
// complete, so every string push() returns ends on a character boundary; bytes that can never
// complete (invalid UTF-8 produced by the model) are passed through. The concatenation of every
// push() and the final finish() equals Tokenizer::decode of the same ids. The Tokenizer must
// outlive the decoder.
class TokenStreamDecoder {
  public:
    // at_sequence_start: the first token starts the text (the SentencePiece leading space is
    // dropped, as decode() does); false when continuing text decoded earlier, e.g. the
    // continuation of a prompt.
    explicit TokenStreamDecoder(const Tokenizer& tokenizer, bool render_special = false,
                                bool at_sequence_start = true);

    // Adds one token; returns the text it completes (possibly empty).
    std::string push(int32_t id);
    // Returns whatever is still held back (an incomplete character at the end of the stream).
    std::string finish();
    size_t heldBytes() const { return held_.size(); }

  private:
    const Tokenizer* tokenizer_;
    bool render_special_;
    bool strip_space_;
    std::string held_;
};

}  // namespace blue
