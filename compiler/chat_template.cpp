// Chat templates: family detection from Jinja source or from the vocabulary, and one formatter
// per family reproducing its published template (minus the leading BOS).
#include "compiler/chat_template.h"

#include <algorithm>

namespace blue {
namespace {

struct NamedTemplate {
    ChatTemplate t;
    const char* name;
};

constexpr NamedTemplate kNames[] = {
    {ChatTemplate::ChatMl, "chatml"},
    {ChatTemplate::Llama2, "llama2"},
    {ChatTemplate::Llama3, "llama3"},
    {ChatTemplate::MistralV1, "mistral-v1"},
    {ChatTemplate::MistralV3, "mistral-v3"},
    {ChatTemplate::MistralV3Tekken, "mistral-v3-tekken"},
    {ChatTemplate::MistralV7, "mistral-v7"},
    {ChatTemplate::Zephyr, "zephyr"},
    {ChatTemplate::Phi3, "phi3"},
    {ChatTemplate::Gemma, "gemma"},
    {ChatTemplate::Deepseek, "deepseek"},
    {ChatTemplate::Deepseek2, "deepseek2"},
    {ChatTemplate::Deepseek3, "deepseek3"},
};

constexpr std::string_view kDsUser = "<\xef\xbd\x9cUser\xef\xbd\x9c>";  // <｜User｜>
constexpr std::string_view kDsAssistant =
    "<\xef\xbd\x9c"
    "Assistant\xef\xbd\x9c>";  // <｜Assistant｜>
constexpr std::string_view kDsEnd =
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";  // <｜end▁of▁sentence｜>

bool has(std::string_view s, std::string_view part) {
    return s.find(part) != std::string_view::npos;
}

std::string trim(std::string_view s) {
    auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
    while (!s.empty() && space(s.front())) s.remove_prefix(1);
    while (!s.empty() && space(s.back())) s.remove_suffix(1);
    return std::string(s);
}

bool isSystem(const ChatMessage& m) {
    return m.role == "system";
}
bool isUser(const ChatMessage& m) {
    return m.role == "user";
}

// Roles must be plain names; families with fixed roles take only system/user/assistant, and some
// take a system message only in first position.
Status checkRoles(ChatTemplate t, const std::vector<ChatMessage>& messages) {
    const bool any_role = t == ChatTemplate::ChatMl || t == ChatTemplate::Llama3;
    // Mistral's tool-aware templates: tool results and the tools' description have markers.
    const bool mistral_tools = t == ChatTemplate::MistralV3 || t == ChatTemplate::MistralV3Tekken ||
                               t == ChatTemplate::MistralV7;
    const bool leading_system_only = t == ChatTemplate::Llama2 || t == ChatTemplate::MistralV1 ||
                                     t == ChatTemplate::MistralV3 ||
                                     t == ChatTemplate::MistralV3Tekken || t == ChatTemplate::Gemma;
    const char* name = chatTemplateName(t).data();
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string& role = messages[i].role;
        bool plain = !role.empty() && std::all_of(role.begin(), role.end(), [](char c) {
            return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '_' || c == '-';
        });
        if (!plain)
            return BLUE_ERROR(
                "chat template %s: message %zu has role '%s': roles are letters, "
                "digits, '_' and '-'",
                name, i, ggufPrintable(role).c_str());
        if (mistral_tools && (role == "tool" || role == "available_tools")) continue;
        if (!any_role && role != "system" && role != "user" && role != "assistant")
            return BLUE_ERROR(
                "chat template %s: message %zu has role '%s' (expected system, user "
                "or assistant%s)",
                name, i, role.c_str(), mistral_tools ? ", or tool and available_tools" : "");
        if (leading_system_only && role == "system" && i != 0)
            return BLUE_ERROR(
                "chat template %s: message %zu is a system message; this template "
                "takes one only as the first message",
                name, i);
    }
    return {};
}

std::string formatChatMl(const std::vector<ChatMessage>& msgs, bool gen) {
    std::string out;
    for (const ChatMessage& m : msgs)
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (gen) out += "<|im_start|>assistant\n";
    return out;
}

std::string formatLlama3(const std::vector<ChatMessage>& msgs, bool gen) {
    std::string out;
    for (const ChatMessage& m : msgs)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) +
               "<|eot_id|>";
    if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
}

// Meta's format: the system prompt sits in <<SYS>> inside the first [INST]; every later turn
// starts with BOS.
std::string formatLlama2(const std::vector<ChatMessage>& msgs, const ChatTokenTexts& tok) {
    std::string out, system;
    bool has_system = false, first_turn = true;
    for (const ChatMessage& m : msgs) {
        if (isSystem(m)) {
            system = m.content;
            has_system = true;
        } else if (isUser(m)) {
            std::string content = m.content;
            if (has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
            has_system = false;
            out += (first_turn ? "" : tok.bos) + "[INST] " + trim(content) + " [/INST]";
            first_turn = false;
        } else {
            out += " " + trim(m.content) + " " + tok.eos;
        }
    }
    return out;
}

// Mistral's tool markers (v3, tekken and v7; checkRoles admits the roles): role `tool` is a
// result inside [TOOL_RESULTS], role `available_tools` the tools' description inside
// [AVAILABLE_TOOLS] (the caller puts it before the last user message, as Mistral's templates
// do), and an assistant message that starts with [TOOL_CALLS] is calls, written as they are.
// v3 puts a space after the opening markers, tekken and v7 none. Returns false for other roles.
bool mistralToolTurn(bool spaced, const ChatMessage& m, const ChatTokenTexts& tok, std::string& out) {
    const char* gap = spaced ? " " : "";
    if (m.role == "tool") {
        out += "[TOOL_RESULTS]" + std::string(gap) + m.content + "[/TOOL_RESULTS]";
    } else if (m.role == "available_tools") {
        out += "[AVAILABLE_TOOLS]" + std::string(gap) + m.content + "[/AVAILABLE_TOOLS]";
    } else if (m.role == "assistant" && m.content.starts_with("[TOOL_CALLS]")) {
        out += m.content + tok.eos;
    } else {
        return false;
    }
    return true;
}

// Mistral's v1/v3/tekken formats differ in spacing and in which user message carries the system
// prompt (v1: the first, v3 and tekken: the last).
Result<std::string> formatMistral(ChatTemplate t, const std::vector<ChatMessage>& msgs,
                                  const ChatTokenTexts& tok) {
    const bool v1 = t == ChatTemplate::MistralV1, tekken = t == ChatTemplate::MistralV3Tekken;
    std::string system;
    bool has_system = !msgs.empty() && isSystem(msgs[0]);
    if (has_system) system = msgs[0].content;
    size_t carrier = msgs.size();  // the user message that carries the system prompt
    for (size_t i = 0; i < msgs.size(); ++i)
        if (isUser(msgs[i]) && (carrier == msgs.size() || !v1)) carrier = i;
    if (has_system && carrier == msgs.size())
        return BLUE_ERROR("chat template %s: a system message needs a user message to go with",
                          chatTemplateName(t).data());
    std::string out;
    for (size_t i = has_system ? 1 : 0; i < msgs.size(); ++i) {
        const ChatMessage& m = msgs[i];
        if (!v1 && mistralToolTurn(!tekken, m, tok, out)) continue;
        if (isUser(m)) {
            std::string content = (has_system && i == carrier ? system + "\n\n" : "") + m.content;
            out += v1 ? " [INST] " + content + " [/INST]"
                      : (tekken ? "[INST]" : "[INST] ") + content + "[/INST]";
        } else if (v1) {
            out += " " + m.content + tok.eos;
        } else {
            out += (tekken ? "" : " ") + (tekken ? m.content : trim(m.content)) + tok.eos;
        }
    }
    return out;
}

std::string formatMistralV7(const std::vector<ChatMessage>& msgs, const ChatTokenTexts& tok) {
    std::string out;
    for (const ChatMessage& m : msgs) {
        if (mistralToolTurn(false, m, tok, out)) continue;
        if (isSystem(m)) {
            out += "[SYSTEM_PROMPT] " + m.content + "[/SYSTEM_PROMPT]";
        } else if (isUser(m)) {
            out += "[INST] " + m.content + "[/INST]";
        } else {
            out += " " + m.content + tok.eos;
        }
    }
    return out;
}

// Zephyr and Phi-3: <|role|>\ncontent<end>\n, where <end> is EOS for Zephyr and <|end|> for Phi-3.
std::string formatRoleTags(const std::vector<ChatMessage>& msgs, bool gen, std::string_view end) {
    std::string out;
    for (const ChatMessage& m : msgs)
        out += "<|" + m.role + "|>\n" + m.content + std::string(end) + "\n";
    if (gen) out += "<|assistant|>\n";
    return out;
}

// Gemma has no system role: the system prompt opens the first turn.
std::string formatGemma(const std::vector<ChatMessage>& msgs, bool gen) {
    std::string out, prefix;
    for (const ChatMessage& m : msgs) {
        if (isSystem(m)) {
            prefix = m.content + "\n\n";
            continue;
        }
        out += "<start_of_turn>" + std::string(isUser(m) ? "user" : "model") + "\n" + prefix +
               trim(m.content) + "<end_of_turn>\n";
        prefix.clear();
    }
    if (gen) out += "<start_of_turn>model\n";
    return out;
}

std::string formatDeepseek(ChatTemplate t, const std::vector<ChatMessage>& msgs, bool gen,
                           const ChatTokenTexts& tok) {
    std::string out, system;
    for (const ChatMessage& m : msgs) {
        if (t == ChatTemplate::Deepseek) {
            out += isSystem(m) ? m.content
                   : isUser(m) ? "### Instruction:\n" + m.content + "\n"
                               : "### Response:\n" + m.content + "\n<|EOT|>\n";
        } else if (t == ChatTemplate::Deepseek2) {
            out += isSystem(m) ? m.content + "\n\n"
                   : isUser(m) ? "User: " + m.content + "\n\n"
                               : "Assistant: " + m.content + tok.eos;
        } else if (isSystem(m)) {  // DeepSeek V3 gathers system prompts at the start
            system += (system.empty() ? "" : "\n\n") + m.content;
        } else {
            out += isUser(m) ? std::string(kDsUser) + m.content
                             : std::string(kDsAssistant) + m.content + std::string(kDsEnd);
        }
    }
    if (gen)
        out += t == ChatTemplate::Deepseek    ? "### Response:\n"
               : t == ChatTemplate::Deepseek2 ? "Assistant:"
                                              : std::string(kDsAssistant);
    return system + out;
}

// Templates with [INST]: Mistral's official v1/v3/tekken/v7 templates differ in the quoted
// spacing around "[INST]"; anything else with [INST] is Llama 2 style.
std::optional<ChatTemplate> detectMistralFamily(std::string_view s) {
    if (has(s, "[SYSTEM_PROMPT]")) return ChatTemplate::MistralV7;
    if (has(s, "<<SYS>>")) return ChatTemplate::Llama2;
    if (has(s, "' [INST] '") || has(s, "\" [INST] \"")) return ChatTemplate::MistralV1;
    if (has(s, "'[INST]'") || has(s, "\"[INST]\"")) return ChatTemplate::MistralV3Tekken;
    if (has(s, "' [/INST]'")) return ChatTemplate::Llama2;  // early Mistral Instruct
    if (has(s, "'[INST] '") || has(s, "\"[INST] \"") || has(s, "[AVAILABLE_TOOLS]"))
        return ChatTemplate::MistralV3;
    return ChatTemplate::Llama2;
}

// Inference for files without a template: special tokens the families' prompts use.
ChatTemplate inferFromVocabulary(const GgufFile& f) {
    auto tokens = f.getStringArray("tokenizer.ggml.tokens");
    auto vocab_has = [&](std::string_view text) {
        return tokens && std::find(tokens->begin(), tokens->end(), text) != tokens->end();
    };
    auto arch = f.getStringOr("general.architecture", "");
    if (vocab_has("<|im_start|>")) return ChatTemplate::ChatMl;
    if (vocab_has("<|start_header_id|>")) return ChatTemplate::Llama3;
    if (vocab_has("<start_of_turn>")) return ChatTemplate::Gemma;
    if (vocab_has(kDsUser) && vocab_has(kDsAssistant)) return ChatTemplate::Deepseek3;
    if ((vocab_has("<|assistant|>") && vocab_has("<|end|>")) || (arch && *arch == "phi3"))
        return ChatTemplate::Phi3;
    if (vocab_has("[INST]")) return ChatTemplate::MistralV3;
    return ChatTemplate::ChatMl;
}

ChatTokenTexts tokenTexts(const GgufFile& f) {
    ChatTokenTexts t;
    auto tokens = f.getStringArray("tokenizer.ggml.tokens");
    if (!tokens) return t;
    auto text = [&](const char* key, std::string& out) {
        auto id = f.getU32Or(key, UINT32_MAX);
        if (id && *id < tokens->size()) out = std::string((*tokens)[*id]);
    };
    text("tokenizer.ggml.bos_token_id", t.bos);
    text("tokenizer.ggml.eos_token_id", t.eos);
    return t;
}

}  // namespace

std::string_view chatTemplateName(ChatTemplate t) {
    for (const NamedTemplate& n : kNames)
        if (n.t == t) return n.name;
    return "?";
}

std::optional<ChatTemplate> chatTemplateFromName(std::string_view name) {
    for (const NamedTemplate& n : kNames)
        if (name == n.name) return n.t;
    return std::nullopt;
}

std::optional<ChatTemplate> detectChatTemplate(std::string_view s) {
    if (auto named = chatTemplateFromName(s)) return named;
    if (has(s, "<|im_start|>")) return ChatTemplate::ChatMl;
    if (has(s, "[INST]")) return detectMistralFamily(s);
    if (has(s, "<|start_header_id|>") && has(s, "<|end_header_id|>")) return ChatTemplate::Llama3;
    if (has(s, "<start_of_turn>")) return ChatTemplate::Gemma;
    if (has(s, "<|assistant|>") && has(s, "<|end|>")) return ChatTemplate::Phi3;
    if (has(s, "<|user|>") && (has(s, "eos_token") || has(s, "</s>") || has(s, "<|endoftext|>")))
        return ChatTemplate::Zephyr;
    if (has(s, "### Instruction:") && has(s, "<|EOT|>")) return ChatTemplate::Deepseek;
    if (has(s, kDsUser) && has(s, kDsAssistant)) return ChatTemplate::Deepseek3;
    if (has(s, "'Assistant: ' + message['content'] + eos_token")) return ChatTemplate::Deepseek2;
    return std::nullopt;
}

Result<ChatTemplate> chatTemplateOf(const GgufFile& file) {
    constexpr const char* kKey = "tokenizer.chat_template";
    if (!file.has(kKey)) return inferFromVocabulary(file);
    auto source = file.getString(kKey);
    if (!source) return source.status();
    if (auto t = detectChatTemplate(*source)) return *t;
    std::string names;
    for (const NamedTemplate& n : kNames) names += std::string(names.empty() ? "" : ", ") + n.name;
    return BLUE_ERROR(
        "%s: key '%s': unrecognised chat template '%s' (BlueVM formats these "
        "families: %s)",
        file.name().c_str(), kKey, ggufPrintable(*source, 60).c_str(), names.c_str());
}

Result<std::string> formatChat(ChatTemplate t, const std::vector<ChatMessage>& messages, bool gen,
                               const ChatTokenTexts& tok) {
    BLUE_TRY(checkRoles(t, messages));
    switch (t) {
        case ChatTemplate::ChatMl:
            return formatChatMl(messages, gen);
        case ChatTemplate::Llama2:
            return formatLlama2(messages, tok);
        case ChatTemplate::Llama3:
            return formatLlama3(messages, gen);
        case ChatTemplate::MistralV1:
        case ChatTemplate::MistralV3:
        case ChatTemplate::MistralV3Tekken:
            return formatMistral(t, messages, tok);
        case ChatTemplate::MistralV7:
            return formatMistralV7(messages, tok);
        case ChatTemplate::Zephyr:
            return formatRoleTags(messages, gen, tok.eos);
        case ChatTemplate::Phi3:
            return formatRoleTags(messages, gen, "<|end|>");
        case ChatTemplate::Gemma:
            return formatGemma(messages, gen);
        case ChatTemplate::Deepseek:
        case ChatTemplate::Deepseek2:
        case ChatTemplate::Deepseek3:
            return formatDeepseek(t, messages, gen, tok);
    }
    return BLUE_ERROR("chat template %d is not known", int(t));
}

Result<std::string> applyChatTemplate(const GgufFile& file,
                                      const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt) {
    auto t = chatTemplateOf(file);
    if (!t) return t.status();
    return formatChat(*t, messages, add_generation_prompt, tokenTexts(file));
}

}  // namespace blue
