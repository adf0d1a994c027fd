// Pre-tokenizers for byte-level BPE: split text into pieces before merges run, by the regular
// expressions of the model family named in `tokenizer.ggml.pre`. Each expression of a family is
// applied in turn to every piece the previous one produced; its matches and the text between them
// both become pieces (Hugging Face's Split with behaviour "isolated"), so the pieces always cover
// the text exactly. Matching uses ICU, whose \p{L}, \p{N}, \p{P} and White_Space are right for all
// of Unicode; `\s` in the published expressions is read as Unicode White_Space, as in the
// Hugging Face tokenizers that produced the vocabularies.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "vm/status.h"

namespace blue {

class PreTokenizer {
  public:
    ~PreTokenizer();

    // Accepts every tokenizer.ggml.pre value llama.cpp knows (supportedNames()); fails for any
    // other name with a message that lists them.
    static Result<std::unique_ptr<PreTokenizer>> create(std::string_view name);

    // Llama 3 and Tekken keep a whole piece that is itself a token instead of merging it.
    bool ignoreMerges() const { return ignore_merges_; }
    // The family's tokenizers add BOS by default (Llama 3, Tekken, Chameleon).
    bool addBos() const { return add_bos_; }
    // The family's encoders end a sequence with SEP by default (Jina v1/v2-code, RoBERTa).
    bool addSep() const { return add_sep_; }

    // Appends the pieces of `text` to `out` (views into `text`, in order, covering it). Invalid
    // UTF-8 is matched as U+FFFD (a symbol, \p{So}), one byte at a time, and kept as is in the
    // pieces. An expression's empty matches cut the text where they match.
    void split(std::string_view text, std::vector<std::string_view>& out) const;

    // Every name create() accepts.
    static std::vector<std::string> supportedNames();

  private:
    struct Impl;
    PreTokenizer() = default;
    std::unique_ptr<Impl> impl_;
    bool ignore_merges_ = false;
    bool add_bos_ = false;
    bool add_sep_ = false;
};

}  // namespace blue
