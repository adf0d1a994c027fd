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

    // Names accepted: default, gpt2 / gpt-2 / phi-2, llama3 / llama-v3 / llama-bpe, qwen2 /
    // deepseek-r1-qwen, deepseek-coder, deepseek-llm, starcoder / smollm. Fails naming the
    // pre-tokenizer for any other name.
    static Result<std::unique_ptr<PreTokenizer>> create(std::string_view name);

    // Llama 3's tokenizer keeps a whole piece that is itself a token instead of merging it.
    bool ignoreMerges() const { return ignore_merges_; }

    // Appends the pieces of `text` to `out` (views into `text`, in order, covering it). Invalid
    // UTF-8 is matched as U+FFFD, one byte at a time, and kept as is in the pieces.
    void split(std::string_view text, std::vector<std::string_view>& out) const;

    // Every name create() accepts.
    static std::vector<std::string> supportedNames();

  private:
    struct Impl;
    PreTokenizer() = default;
    std::unique_ptr<Impl> impl_;
    bool ignore_merges_ = false;
};

}  // namespace blue
