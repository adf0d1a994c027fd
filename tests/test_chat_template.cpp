// Tests of the chat templates: the exact text each family's formatter produces for a
// system + user + assistant + user conversation (expected strings written from the families'
// published formats), family detection from published template sources and from vocabularies,
// and the errors for unknown templates and roles a family cannot express.
#include <doctest/doctest.h>

#include <algorithm>

#include "compiler/chat_template.h"
#include "compiler/tokenizer.h"
#include "tests/test_paths.h"

namespace blue {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."},
    {"user", "Hi!"},
    {"assistant", "Hello."},
    {"user", "2+2?"},
};

const std::string kDsEnd =
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
const std::string kDsUser = "<\xef\xbd\x9cUser\xef\xbd\x9c>";
const std::string kDsAssistant =
    "<\xef\xbd\x9c"
    "Assistant\xef\xbd\x9c>";

std::string format(ChatTemplate t, bool gen, const ChatTokenTexts& tok = {}) {
    Result<std::string> r = formatChat(t, kConversation, gen, tok);
    REQUIRE_MESSAGE(r.isOk(), r.message());
    return *r;
}

Result<GgufFile> vocabWith(std::optional<std::string> chat_template,
                           std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"}) {
    GgufWriter w;
    w.setString("general.architecture", "llama");
    w.setString("tokenizer.ggml.model", "llama");
    w.setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
    w.setU32("tokenizer.ggml.bos_token_id", 1);
    w.setU32("tokenizer.ggml.eos_token_id", 2);
    if (chat_template) w.setString("tokenizer.chat_template", *chat_template);
    auto bytes = w.writeToMemory();
    REQUIRE(bytes.isOk());
    return ggufParse(std::move(bytes).value(), "chat.gguf");
}

}  // namespace

TEST_CASE("chat template: each family's text for system + user + assistant + user") {
    CHECK(format(ChatTemplate::ChatMl, true) ==
          "<|im_start|>system\nYou are terse.<|im_end|>\n"
          "<|im_start|>user\nHi!<|im_end|>\n"
          "<|im_start|>assistant\nHello.<|im_end|>\n"
          "<|im_start|>user\n2+2?<|im_end|>\n"
          "<|im_start|>assistant\n");
    CHECK(format(ChatTemplate::Llama2, true) ==
          "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi! [/INST] Hello. </s><s>[INST] 2+2? "
          "[/INST]");
    CHECK(format(ChatTemplate::Llama3, true) ==
          "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(format(ChatTemplate::MistralV1, true) ==
          " [INST] You are terse.\n\nHi! [/INST] Hello.</s> [INST] 2+2? [/INST]");
    CHECK(format(ChatTemplate::MistralV3, true) ==
          "[INST] Hi![/INST] Hello.</s>[INST] You are terse.\n\n2+2?[/INST]");
    CHECK(format(ChatTemplate::MistralV3Tekken, true) ==
          "[INST]Hi![/INST]Hello.</s>[INST]You are terse.\n\n2+2?[/INST]");
    CHECK(format(ChatTemplate::MistralV7, true) ==
          "[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT][INST] Hi![/INST] Hello.</s>"
          "[INST] 2+2?[/INST]");
    CHECK(format(ChatTemplate::Zephyr, true) ==
          "<|system|>\nYou are terse.</s>\n<|user|>\nHi!</s>\n<|assistant|>\nHello.</s>\n"
          "<|user|>\n2+2?</s>\n<|assistant|>\n");
    CHECK(format(ChatTemplate::Phi3, true) ==
          "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi!<|end|>\n<|assistant|>\nHello.<|end|>\n"
          "<|user|>\n2+2?<|end|>\n<|assistant|>\n");
    CHECK(format(ChatTemplate::Gemma, true) ==
          "<start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n"
          "<start_of_turn>model\nHello.<end_of_turn>\n"
          "<start_of_turn>user\n2+2?<end_of_turn>\n"
          "<start_of_turn>model\n");
    CHECK(format(ChatTemplate::Deepseek, true) ==
          "You are terse.### Instruction:\nHi!\n### Response:\nHello.\n<|EOT|>\n"
          "### Instruction:\n2+2?\n### Response:\n");
    CHECK(format(ChatTemplate::Deepseek2, true, {"<s>", kDsEnd}) ==
          "You are terse.\n\nUser: Hi!\n\nAssistant: Hello." + kDsEnd + "User: 2+2?\n\nAssistant:");
    CHECK(format(ChatTemplate::Deepseek3, true) == "You are terse." + kDsUser + "Hi!" +
                                                       kDsAssistant + "Hello." + kDsEnd + kDsUser +
                                                       "2+2?" + kDsAssistant);
}

TEST_CASE("chat template: generation prompt, token texts and content handling") {
    CHECK(format(ChatTemplate::ChatMl, false) ==
          "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
          "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n");
    // [INST] ... [/INST] already opens the answer.
    CHECK(format(ChatTemplate::Llama2, false) == format(ChatTemplate::Llama2, true));
    CHECK(format(ChatTemplate::Gemma, false) ==
          "<start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n"
          "<start_of_turn>model\nHello.<end_of_turn>\n"
          "<start_of_turn>user\n2+2?<end_of_turn>\n");
    // The vocabulary's EOS/BOS texts are what Llama 2 and Zephyr spell out.
    CHECK(format(ChatTemplate::Llama2, true, {"<bos>", "<eos>"}) ==
          "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi! [/INST] Hello. <eos><bos>[INST] 2+2? "
          "[/INST]");
    // Llama 3 and Gemma trim message content; ChatML keeps it verbatim.
    std::vector<ChatMessage> padded = {{"user", "  spaced \n"}};
    CHECK(*formatChat(ChatTemplate::Llama3, padded, false) ==
          "<|start_header_id|>user<|end_header_id|>\n\nspaced<|eot_id|>");
    CHECK(*formatChat(ChatTemplate::ChatMl, padded, false) ==
          "<|im_start|>user\n  spaced \n<|im_end|>\n");
    CHECK(*formatChat(ChatTemplate::ChatMl, {{"tool", "42"}}, false) ==
          "<|im_start|>tool\n42<|im_end|>\n");
    CHECK(*formatChat(ChatTemplate::ChatMl, {}, true) == "<|im_start|>assistant\n");
}

TEST_CASE("chat template: roles a family cannot express are refused") {
    auto message = [](ChatTemplate t, std::vector<ChatMessage> msgs) {
        Result<std::string> r = formatChat(t, msgs, true);
        REQUIRE_FALSE(r.isOk());
        return r.message();
    };
    CHECK(message(ChatTemplate::Llama2, {{"user", "a"}, {"tool", "b"}}) ==
          "chat template llama2: message 1 has role 'tool' (expected system, user or assistant)");
    CHECK(message(ChatTemplate::ChatMl, {{"us er", "a"}}).find("roles are letters") !=
          std::string::npos);
    CHECK(message(ChatTemplate::ChatMl, {{"", "a"}}).find("message 0 has role ''") !=
          std::string::npos);
    CHECK(message(ChatTemplate::Gemma, {{"user", "a"}, {"system", "b"}}) ==
          "chat template gemma: message 1 is a system message; this template takes one only as "
          "the first message");
    CHECK(message(ChatTemplate::MistralV3, {{"system", "a"}}).find("needs a user message") !=
          std::string::npos);
}

// Mistral's tool turns (host/server/tools.cpp writes them): the tools before the last user
// message, calls after [TOOL_CALLS], results inside [TOOL_RESULTS]; v3 spaced, tekken and v7 not;
// v1 has no such markers and refuses the roles.
TEST_CASE("chat template: Mistral's tool markers in v3, tekken and v7") {
    const std::vector<ChatMessage> turns = {
        {"system", "Be brief."},
        {"user", "Weather?"},
        {"assistant", R"([TOOL_CALLS] [{"name":"w","arguments":{}}])"},
        {"tool", R"({"content":"sunny"})"},
        {"available_tools", R"([{"type":"function"}])"},
        {"user", "And now?"},
    };
    ChatTokenTexts tok;
    tok.eos = "</s>";
    auto text = [&](ChatTemplate t) {
        Result<std::string> r = formatChat(t, turns, true, tok);
        REQUIRE_MESSAGE(r.isOk(), r.message());
        return *r;
    };
    CHECK(text(ChatTemplate::MistralV3) ==
          R"([INST] Weather?[/INST][TOOL_CALLS] [{"name":"w","arguments":{}}]</s>[TOOL_RESULTS] {"content":"sunny"}[/TOOL_RESULTS])"
          R"([AVAILABLE_TOOLS] [{"type":"function"}][/AVAILABLE_TOOLS][INST] Be brief.)" "\n\n" "And now?[/INST]");
    CHECK(text(ChatTemplate::MistralV3Tekken) ==
          R"([INST]Weather?[/INST][TOOL_CALLS] [{"name":"w","arguments":{}}]</s>[TOOL_RESULTS]{"content":"sunny"}[/TOOL_RESULTS])"
          R"([AVAILABLE_TOOLS][{"type":"function"}][/AVAILABLE_TOOLS][INST]Be brief.)" "\n\n" "And now?[/INST]");
    CHECK(text(ChatTemplate::MistralV7) ==
          R"([SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Weather?[/INST][TOOL_CALLS] [{"name":"w","arguments":{}}]</s>)"
          R"([TOOL_RESULTS]{"content":"sunny"}[/TOOL_RESULTS][AVAILABLE_TOOLS][{"type":"function"}][/AVAILABLE_TOOLS])"
          R"([INST] And now?[/INST])");
    Result<std::string> v1 = formatChat(ChatTemplate::MistralV1, turns, true, tok);
    REQUIRE_FALSE(v1.isOk());
    CHECK(v1.message() == "chat template mistral-v1: message 3 has role 'tool' (expected system, user or assistant)");
    Result<std::string> odd = formatChat(ChatTemplate::MistralV3, {{"user", "a"}, {"ipython", "b"}}, true, tok);
    REQUIRE_FALSE(odd.isOk());
    CHECK(odd.message() == "chat template mistral-v3: message 1 has role 'ipython' (expected system, user or "
                           "assistant, or tool and available_tools)");
}

TEST_CASE("chat template: families detected from published template sources") {
    struct Source {
        const char* jinja;
        ChatTemplate expect;
    };
    const Source sources[] = {
        {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
         ChatTemplate::ChatMl},
        {"{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
         "message['content'] %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}",
         ChatTemplate::Llama2},
        {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
         "message['content'] | trim + '<|eot_id|>' }}",
         ChatTemplate::Llama3},
        {"{{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}",
         ChatTemplate::MistralV1},
        {"{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}", ChatTemplate::MistralV3},
        {"{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}", ChatTemplate::MistralV3Tekken},
        {"{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{{- '[INST]' }}",
         ChatTemplate::MistralV7},
        {"{{ '<|user|>\\n' + message['content'] + eos_token }}{{ '<|assistant|>' }}",
         ChatTemplate::Zephyr},
        {"{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
         ChatTemplate::Gemma},
        {"{{'### Instruction:\\n' + message['content'] + '\\n'}}{{'### Response:\\n' + "
         "message['content'] + '\\n<|EOT|>\\n'}}",
         ChatTemplate::Deepseek},
        {"{{ 'User: ' + message['content'] + '\\n\\n' }}{{ 'Assistant: ' + message['content'] + "
         "eos_token }}",
         ChatTemplate::Deepseek2},
        {"chatml", ChatTemplate::ChatMl},
        {"mistral-v7", ChatTemplate::MistralV7},
    };
    for (const Source& s : sources) {
        CAPTURE(std::string(s.jinja));
        std::optional<ChatTemplate> t = detectChatTemplate(s.jinja);
        REQUIRE(t.has_value());
        CHECK(chatTemplateName(*t) == chatTemplateName(s.expect));
    }
    std::string v3 = "{{'" + kDsUser + "' + message['content']}}{{'" + kDsAssistant + "'}}";
    CHECK(detectChatTemplate(v3) == ChatTemplate::Deepseek3);
    CHECK_FALSE(detectChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}"));
    for (ChatTemplate t : {ChatTemplate::ChatMl, ChatTemplate::Deepseek3, ChatTemplate::Phi3})
        CHECK(chatTemplateFromName(chatTemplateName(t)) == t);
}

TEST_CASE("chat template: model files") {
    // Phi-3's vocabulary file carries its Jinja template.
    Result<GgufFile> phi = ggufOpen(test::sharedDir() + "/vocab/ggml-vocab-phi-3.gguf");
    REQUIRE(phi.isOk());
    CHECK(chatTemplateOf(*phi).value() == ChatTemplate::Phi3);
    Result<std::string> text = applyChatTemplate(*phi, {{"user", "Hi!"}}, true);
    REQUIRE_MESSAGE(text.isOk(), text.message());
    CHECK(*text == "<|user|>\nHi!<|end|>\n<|assistant|>\n");
    Result<Tokenizer> tok = Tokenizer::fromGguf(*phi);
    REQUIRE(tok.isOk());
    std::vector<int32_t> ids = tok->encode(*text, true, true);
    REQUIRE(ids.size() > 4);
    CHECK(ids[0] == tok->bos());
    CHECK(ids[1] == tok->findToken("<|user|>"));
    CHECK(ids.back() == tok->findToken("<|assistant|>"));
    CHECK(std::count(ids.begin(), ids.end(), tok->findToken("<|end|>")) == 1);

    // No template: inferred from the vocabulary, else ChatML.
    Result<GgufFile> stories = ggufOpen(test::sharedDir() + "/models/stories260K/stories260K.gguf");
    REQUIRE(stories.isOk());
    CHECK(chatTemplateOf(*stories).value() == ChatTemplate::ChatMl);
    Result<GgufFile> qwen_like = vocabWith(std::nullopt, {"<unk>", "<s>", "</s>", "<|im_start|>"});
    CHECK(chatTemplateOf(*qwen_like).value() == ChatTemplate::ChatMl);
    Result<GgufFile> llama3 = vocabWith(std::nullopt, {"a", "<|start_header_id|>", "b"});
    CHECK(chatTemplateOf(*llama3).value() == ChatTemplate::Llama3);
    Result<GgufFile> gemma = vocabWith(std::nullopt, {"a", "<start_of_turn>", "b"});
    CHECK(chatTemplateOf(*gemma).value() == ChatTemplate::Gemma);

    // A template is present but unknown: an error naming the key and quoting it.
    Result<GgufFile> odd = vocabWith("{% for m in messages %}<<{{ m.content }}>>{% endfor %}");
    Result<std::string> refused = applyChatTemplate(*odd, kConversation, true);
    REQUIRE_FALSE(refused.isOk());
    CHECK(refused.message().rfind("chat.gguf: key 'tokenizer.chat_template': unrecognised chat "
                                  "template '{% for m in messages %}<<{{ m.content }}>>",
                                  0) == 0);
    CHECK(refused.message().find("chatml, llama2") != std::string::npos);

    // Llama 2's template with the file's own BOS/EOS texts.
    Result<GgufFile> llama2 =
        vocabWith("{{ bos_token + '[INST] <<SYS>>' }}", {"<unk>", "<BOS>", "<EOS>"});
    CHECK(applyChatTemplate(*llama2, kConversation, true).value() ==
          "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi! [/INST] Hello. <EOS><BOS>[INST] 2+2? "
          "[/INST]");
}

}  // namespace blue
