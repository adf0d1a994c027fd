// Chat templates: turn a conversation into the prompt text a chat model was trained on.
//
// GGUF files carry the template as Jinja source (`tokenizer.chat_template`). BlueVM does not run
// Jinja: it recognises the family from marker strings in that source (as llama.cpp's built-in
// detection does) and formats with a built-in formatter that reproduces the family's published
// template. When a file has no template, the family is inferred from the vocabulary's special
// tokens and the architecture, and ChatML is the fallback. A template that is present but
// recognised as no family is an error, never silently replaced.
//
// The text returned does not start with the BOS token: encode it with
// Tokenizer::encode(text, add_special = true, parse_special = true), which adds BOS as the
// vocabulary asks and turns the template's special-token text into special tokens. Message content
// is inserted verbatim (any special-token text inside it is parsed too).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/gguf.h"
#include "vm/status.h"

namespace blue {

struct ChatMessage {
    std::string role;  // "system", "user", "assistant" (ChatML and Llama 3 accept other roles)
    std::string content;
};

enum class ChatTemplate {
    ChatMl,           // Qwen, SmolLM, many fine-tunes: <|im_start|>role\n...<|im_end|>
    Llama2,           // [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]
    Llama3,           // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
    MistralV1,        // " [INST] ... [/INST] ...</s>", system before the first user message
    MistralV3,        // "[INST] ...[/INST] ...</s>", system before the last user message
    MistralV3Tekken,  // "[INST]...[/INST]...</s>"
    MistralV7,        // [SYSTEM_PROMPT] ...[/SYSTEM_PROMPT][INST] ...[/INST] ...</s>
    Zephyr,           // <|user|>\n...</s>\n
    Phi3,             // <|user|>\n...<|end|>\n
    Gemma,            // <start_of_turn>user\n...<end_of_turn>\n, assistant is "model"
    Deepseek,         // DeepSeek Coder: ### Instruction:\n...\n### Response:\n
    Deepseek2,        // DeepSeek V2: User: ...\n\nAssistant: ...<｜end▁of▁sentence｜>
    Deepseek3,        // DeepSeek V3: <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
};

// "chatml", "llama2", "llama3", "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7",
// "zephyr", "phi3", "gemma", "deepseek", "deepseek2", "deepseek3".
std::string_view chatTemplateName(ChatTemplate t);
std::optional<ChatTemplate> chatTemplateFromName(std::string_view name);

// The family of a template given as Jinja source (or as one of the names above); nullopt when no
// family's markers are found.
std::optional<ChatTemplate> detectChatTemplate(std::string_view source);

// The family for a model file: from `tokenizer.chat_template` when present (an unrecognised
// template fails, quoting its start); otherwise from the vocabulary's special tokens and
// `general.architecture`, falling back to ChatML.
Result<ChatTemplate> chatTemplateOf(const GgufFile& file);

// Texts of the tokens some templates spell out (Llama 2's "</s><s>", Zephyr's end of message).
struct ChatTokenTexts {
    std::string bos = "<s>";
    std::string eos = "</s>";
};

// Formats `messages`. add_generation_prompt appends the opening of an assistant turn (templates
// whose user turn already ends with it, such as [INST] ... [/INST], ignore it). Fails on a role
// the family cannot express (e.g. "tool" for Llama 2), an empty role or one with characters
// other than letters, digits, '_' and '-', or a system message after the first message where the
// family only takes a leading one.
Result<std::string> formatChat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt, const ChatTokenTexts& tokens = {});

// chatTemplateOf + formatChat, with the BOS/EOS texts taken from the file's vocabulary.
Result<std::string> applyChatTemplate(const GgufFile& file,
                                      const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt);

}  // namespace blue
