// Vocabularies for synthetic models (see synth.h): a SentencePiece-style llama vocabulary and a
// byte-level BPE (gpt2) vocabulary with merges, both of any size >= 260 and both built only from
// pieces the tokenizers can reach (every multi-character piece is a shorter piece plus a letter).
#include <cassert>
#include <string>
#include <vector>

#include "tools/synth/synth.h"

namespace blue {

namespace {

// llama.cpp's token types.
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUnused = 5, kByte = 6;

constexpr std::string_view kLetters = "etaoinshrdlcumwfgypbvkjxqz";  // by English frequency
constexpr std::string_view kSpm = "\xE2\x96\x81";                    // U+2581 "▁"
constexpr uint32_t kQwenSpecialBase = 151643;                        // <|endoftext|> in Qwen2

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += char(cp);
    } else if (cp < 0x800) {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
    } else {
        s += char(0xE0 | (cp >> 12));
        s += char(0x80 | ((cp >> 6) & 0x3F));
        s += char(0x80 | (cp & 0x3F));
    }
    return s;
}

// Breadth-first: each string of `level` grown by every letter, until `count` strings are made.
// Calls emit(prefix, letter) for each; the grown strings become the next level.
template <class Emit>
void growPieces(std::vector<std::string> level, size_t count, Emit emit) {
    size_t made = 0;
    while (made < count) {
        std::vector<std::string> next;
        for (const std::string& prefix : level) {
            for (char letter : kLetters) {
                if (made == count) return;
                std::string piece = prefix + letter;
                emit(prefix, std::string(1, letter), piece);
                next.push_back(std::move(piece));
                ++made;
            }
        }
        level = std::move(next);
    }
}

// GPT-2's byte-to-symbol map, in GPT-2's vocabulary order: the printable bytes map to
// themselves (and come first), the others to U+0100 upwards in byte order.
std::vector<std::pair<uint8_t, std::string>> gpt2ByteSymbols() {
    auto printable = [](int b) {
        return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    };
    std::vector<std::pair<uint8_t, std::string>> out;
    for (int b = 0; b < 256; ++b) {
        if (printable(b)) out.push_back({uint8_t(b), utf8(uint32_t(b))});
    }
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
        if (!printable(b)) out.push_back({uint8_t(b), utf8(next++)});
    }
    return out;
}

}  // namespace

void synthAddLlamaVocab(GgufWriter* writer, uint32_t n_vocab, bool mistral_tokens) {
    assert(n_vocab >= 260 + (mistral_tokens ? 7 : 0));
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {kUnknown, kControl, kControl};
    if (mistral_tokens) {
        for (const char* t : {"[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                              "[TOOL_RESULTS]", "[/TOOL_RESULTS]"}) {
            tokens.push_back(t);
            types.push_back(kControl);
        }
    }
    for (int b = 0; b < 256; ++b) {
        tokens.push_back(strFormat("<0x%02X>", b));
        types.push_back(kByte);
    }
    std::vector<std::string> singles = {std::string(kSpm)};
    for (char ch : kLetters) singles.push_back(std::string(1, ch));
    for (char ch : kLetters) singles.push_back(std::string(1, char(ch - 'a' + 'A')));
    for (char ch : std::string_view("0123456789.,!?'\"-:;()"))
        singles.push_back(std::string(1, ch));
    std::vector<float> scores(tokens.size(), 0.0f);
    auto add = [&](const std::string& piece) {
        scores.push_back(-float(tokens.size() - 259));
        tokens.push_back(piece);
        types.push_back(kNormal);
    };
    for (size_t i = 0; i < singles.size() && tokens.size() < n_vocab; ++i) add(singles[i]);
    std::vector<std::string> roots = {std::string(kSpm)};
    for (char ch : kLetters) roots.push_back(std::string(1, ch));
    growPieces(
        roots, n_vocab - tokens.size(),
        [&](const std::string&, const std::string&, const std::string& piece) { add(piece); });
    writer->setString("tokenizer.ggml.model", "llama");
    writer->setString("tokenizer.ggml.pre", "default");
    writer->setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
    writer->setArray<float>("tokenizer.ggml.scores", scores);
    writer->setArray<int32_t>("tokenizer.ggml.token_type", types);
    writer->setU32("tokenizer.ggml.bos_token_id", 1);
    writer->setU32("tokenizer.ggml.eos_token_id", 2);
    writer->setU32("tokenizer.ggml.unknown_token_id", 0);
    writer->setBool("tokenizer.ggml.add_bos_token", true);
    writer->setBool("tokenizer.ggml.add_eos_token", false);
}

void synthAddGpt2Vocab(GgufWriter* writer, uint32_t n_vocab) {
    assert(n_vocab >= 260);
    const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    const uint32_t n_special = 3;
    // Qwen2's layout when the vocabulary is full size: specials at 151643.., padding after them.
    const uint32_t n_pad =
        n_vocab > kQwenSpecialBase + n_special ? n_vocab - kQwenSpecialBase - n_special : 0;
    const uint32_t n_regular = n_vocab - n_special - n_pad;
    std::vector<std::string> tokens, merges;
    std::vector<int32_t> types;
    std::string space;
    for (const auto& [byte, symbol] : gpt2ByteSymbols()) {
        tokens.push_back(symbol);
        types.push_back(kNormal);
        if (byte == ' ') space = symbol;
    }
    std::vector<std::string> roots = {space};
    for (char ch : kLetters) roots.push_back(std::string(1, ch));
    growPieces(roots, n_regular - tokens.size(),
               [&](const std::string& left, const std::string& right, const std::string& piece) {
                   merges.push_back(left + " " + right);
                   tokens.push_back(piece);
                   types.push_back(kNormal);
               });
    const uint32_t eot = uint32_t(tokens.size());
    for (const char* s : specials) {
        tokens.push_back(s);
        types.push_back(kControl);
    }
    while (tokens.size() < n_vocab) {
        tokens.push_back(strFormat("[PAD%zu]", tokens.size()));
        types.push_back(kUnused);
    }
    writer->setString("tokenizer.ggml.model", "gpt2");
    writer->setString("tokenizer.ggml.pre", "qwen2");
    writer->setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
    writer->setArray<int32_t>("tokenizer.ggml.token_type", types);
    writer->setStringArray("tokenizer.ggml.merges", std::span<const std::string>(merges));
    writer->setU32("tokenizer.ggml.bos_token_id", eot);
    writer->setU32("tokenizer.ggml.eos_token_id", eot);
    writer->setU32("tokenizer.ggml.padding_token_id", eot);
    writer->setBool("tokenizer.ggml.add_bos_token", false);
    writer->setString("tokenizer.chat_template",
                      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                      "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
                      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
}

}  // namespace blue
