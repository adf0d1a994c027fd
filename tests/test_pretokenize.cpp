// Tests of the BPE pre-tokenizers (compiler/pretokenize.h): for every family llama.cpp names in
// tokenizer.ggml.pre, a table of hard cases with the pieces its published expressions give,
// worked out from the expressions (digit runs, contractions, CJK, emoji with ZWJ, whitespace runs
// and line breaks, tabs, punctuation runs, combining marks and case changes, invalid UTF-8);
// every alias resolving to its family; the flags families carry; unknown names refused with the
// list; random bytes never crash a splitter and are always covered exactly.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "compiler/pretokenize.h"

namespace blue {
namespace {

std::vector<std::string> splitWith(const PreTokenizer& p, std::string_view text) {
    std::vector<std::string_view> views;
    p.split(text, views);
    return {views.begin(), views.end()};
}

std::unique_ptr<PreTokenizer> make(std::string_view name) {
    auto p = PreTokenizer::create(name);
    REQUIRE_MESSAGE(p.isOk(), p.message());
    return std::move(p).value();
}

// The hard inputs every family is tested on.
constexpr const char* kDigits = "1 12 123 1234 12345";
constexpr const char* kContractions = "it's IT'S we're";
constexpr const char* kCjk = "\u4e2d\u6587\u5b57\u7b26 \ud55c\uad6d\uc5b4";  // 中文字符 한국어
// Man, ZWJ, woman, ZWJ, girl: one emoji sequence; emoji are \p{So}, the joiner \p{Cf}.
constexpr const char* kEmoji = "\U0001F468\u200D\U0001F469\u200D\U0001F467 ok";
constexpr const char* kSpaces = "a   b\n\n  c";
constexpr const char* kTabs = "a\tb\t\tc";
constexpr const char* kPunct = "x...!? y";
// 0xFF never starts UTF-8; 0xC3 is a lead byte cut off by the end: each is one U+FFFD (\p{So}).
constexpr const char* kInvalid =
    "a\xff"
    "b \xff\xff!\xc3";
// "e" + U+0301 (a combining mark, \p{Mn}), an all-caps run ending in a word, a case change.
constexpr const char* kMarks = "cafe\u0301 JSONParser HelloWorld";

// Pieces that recur in the tables.
constexpr const char* kHan = "\u4e2d\u6587\u5b57\u7b26";
constexpr const char* kHangul = "\ud55c\uad6d\uc5b4";
constexpr const char* kSpaceHangul = " \ud55c\uad6d\uc5b4";
constexpr const char* kFamily = "\U0001F468\u200D\U0001F469\u200D\U0001F467";
constexpr const char* kMan = "\U0001F468";
constexpr const char* kWoman = "\U0001F469";
constexpr const char* kGirl = "\U0001F467";
constexpr const char* kZwj = "\u200D";
constexpr const char* kMark = "\u0301";
constexpr const char* kCafe = "cafe\u0301";

struct Case {
    const char* text;
    std::vector<std::string> pieces;
};

struct FamilyCases {
    const char* name;
    std::vector<Case> cases;
};

using V = std::vector<std::string>;

// Digit runs by family: whole after a space, in threes from the start, single, or in threes
// from the end.
const V kDigitsGpt2 = {"1", " 12", " 123", " 1234", " 12345"};
const V kDigitsThree = {"1", " ", "12", " ", "123", " ", "123", "4", " ", "123", "45"};
const V kDigitsOne = {"1", " ", "1", "2", " ", "1", "2", "3", " ", "1",
                      "2", "3", "4", " ", "1", "2", "3", "4", "5"};
const V kDigitsFromEnd = {"1", " ", "12", " ", "123", " ", "1", "234", " ", "12", "345"};

// Whitespace by family: GPT-2 keeps the last space for the next word and joins line breaks to
// the spaces after them; the Llama 3 style takes line breaks (with the whitespace before them)
// as one piece.
const V kSpacesGpt2 = {"a", "  ", " b", "\n\n ", " c"};
const V kSpacesLlama3 = {"a", "  ", " b", "\n\n", " ", " c"};
const V kTabsGpt2 = {"a", "\t", "b", "\t", "\t", "c"};
const V kTabsLlama3 = {"a", "\tb", "\t", "\tc"};

const std::vector<FamilyCases>& familyTables() {
    static const std::vector<FamilyCases> kTables = {
        {"default",
         {{kDigits, kDigitsThree},
          {kContractions, {"it", "'", "s", " IT", "'", "S", " we", "'", "re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesGpt2},
          {kTabs, kTabsGpt2},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid, {"a", "\xff", "b", " \xff\xff", "!", "\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}}}},
        {"gpt2",
         {{kDigits, kDigitsGpt2},
          {kContractions, {"it", "'s", " IT", "'", "S", " we", "'re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesGpt2},
          {kTabs, kTabsGpt2},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid, {"a", "\xff", "b", " \xff\xff!\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}}}},
        {"llama3",
         {{kDigits, kDigitsThree},
          {kContractions, {"it", "'s", " IT", "'S", " we", "'re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid,
           {"a",
            "\xff"
            "b",
            " \xff\xff!\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}},
          {"a!\n\nb", {"a", "!\n\n", "b"}}}},
        {"dbrx", {{kDigits, kDigitsThree}, {kSpaces, kSpacesLlama3}, {kTabs, kTabsLlama3}}},
        {"qwen2",
         {{kDigits, kDigitsOne},
          {kContractions, {"it", "'s", " IT", "'S", " we", "'re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid,
           {"a",
            "\xff"
            "b",
            " \xff\xff!\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}}}},
        {"qwen35",
         {{kDigits, kDigitsOne},
          {kContractions, {"it", "'s", " IT", "'S", " we", "'re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid,
           {"a",
            "\xff"
            "b",
            " \xff\xff!\xc3"}},
          {kMarks, {kCafe, " JSONParser", " HelloWorld"}}}},
        {"deepseek-coder",
         {{kDigits, kDigitsOne},
          {kContractions, {"it", "'", "s", " IT", "'", "S", " we", "'", "re"}},
          {kCjk, {kHan, " ", kHangul}},
          // U+200D lies in the CJK step's U+0800..U+4E00 range, so it is cut out.
          {kEmoji, {kMan, kZwj, kWoman, kZwj, kGirl, " ok"}},
          {kSpaces, {"a", "  ", " b", "\n", "\n", " ", " c"}},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid, {"a", "\xff", "b", " \xff\xff", "!", "\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}}}},
        {"deepseek-llm",
         {{kDigits, {"1", " ", "12", " ", "123", " ", "1234", " ", "12345"}},
          {kContractions, {"it", "'", "s", " IT", "'", "S", " we", "'", "re"}},
          {kCjk, {kHan, " ", kHangul}},
          {kEmoji, {kMan, kZwj, kWoman, kZwj, kGirl, " ok"}},
          {kSpaces, {"a", "  ", " b", "\n", "\n", " ", " c"}},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid, {"a", "\xff", "b", " \xff\xff", "!", "\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}},
          {"a  ", {"a", "  "}}}},
        {"deepseek-v3",
         {{kDigits, kDigitsThree},
          {kContractions, {"it", "'s", " IT", "'S", " we", "'re"}},
          {kCjk, {kHan, kSpaceHangul}},
          // The emoji are symbols (\p{S}); the joiners between them belong to no step.
          {kEmoji, {kMan, kZwj, kWoman, kZwj, kGirl, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid, {"a", "\xff", "b", " \xff\xff!\xc3"}},
          {kMarks, {kCafe, " JSONParser", " HelloWorld"}},
          // Hiragana and katakana join the ideographs; an ASCII mark leads an ASCII word.
          {"\u65e5\u672c\u306e\u30c6\u30ad a.b #tag",
           {"\u65e5\u672c\u306e\u30c6\u30ad", " a", ".b", " #", "tag"}}}},
        {"falcon",
         {{kDigits, {"1", " 12", " ", "123", " ", "123", "4", " ", "123", "45"}},
          {kContractions, {"it", "'", "s", " IT", "'", "S", " we", "'", "re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesGpt2},
          {kTabs, kTabsGpt2},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid, {"a", "\xff", "b", " \xff\xff", "!", "\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}},
          {"a`b", {"a", "`", "b"}}}},
        {"starcoder",
         {{kDigits, kDigitsOne},
          {kContractions, {"it", "'s", " IT", "'", "S", " we", "'re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesGpt2},
          {kTabs, kTabsGpt2},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid, {"a", "\xff", "b", " \xff\xff!\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}}}},
        {"bloom",
         {{kDigits, kDigitsGpt2},
          {kContractions, {"it's", " IT'S", " we're"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, {"a", "  ", " b", "\n\n ", " c"}},
          {kTabs, {"a", "\t", "b", "\t\t", "c"}},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid,
           {"a\xff"
            "b",
            " \xff\xff", "!", "\xc3"}},
          {kMarks, {kCafe, " JSONParser", " HelloWorld"}},
          // The class's parentheses and bar are literal stops, as are the CJK and Devanagari
          // full stops and commas.
          {"f(x)|y\u3002z\u0964w", {"f", "(", "x", ")|", "y", "\u3002", "z", "\u0964", "w"}}}},
        {"viking",
         {{kDigits, kDigitsOne},
          {kContractions, {"it's", " IT'S", " we're"}},
          {kTabs, {"a", "\t", "b", "\t\t", "c"}},
          {kInvalid,
           {"a\xff"
            "b",
            " \xff\xff", "!", "\xc3"}},
          {"a1b", {"a", "1", "b"}}}},
        {"tekken",
         {{kDigits, kDigitsOne},
          {kContractions, {"it", "'s", " IT", "'S", " we", "'re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid,
           {"a",
            "\xff"
            "b",
            " \xff\xff!\xc3"}},
          {kMarks, {kCafe, " JSONParser", " Hello", "World"}},
          {"a/b/\nc", {"a", "/b", "/\n", "c"}}}},
        {"chameleon",
         {{kDigits, kDigitsOne},
          {kContractions, {"it", "'", "s", " IT", "'", "S", " we", "'", "re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, {"a", "  ", " b", "\n", "\n", "  ", "c"}},
          {kTabs, kTabsGpt2},
          {kPunct, {"x", ".", ".", ".", "!", "?", " y"}},
          {kInvalid, {"a", "\xff", "b", " \xff\xff", "!", "\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}},
          // Sentinel and image-token text is cut out first, and the later steps still split it.
          {"a<sentinel:12>IMGIMGABZb",
           {"a", "<", "sentinel", ":", "1", "2", ">", "IMGIMGABZ", "b"}}}},
        {"gpt-4o",
         {{kDigits, kDigitsThree},
          {kContractions, {"it's", " IT'S", " we're"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid,
           {"a",
            "\xff"
            "b",
            " \xff\xff!\xc3"}},
          {kMarks, {kCafe, " JSONParser", " Hello", "World"}},
          // After a symbol run's line breaks, slashes join too.
          {"a!\n/b", {"a", "!\n/", "b"}}}},
        {"kimi-k2",
         {{kDigits, kDigitsThree},
          {kContractions, {"it's", " IT'S", " we're"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid,
           {"a",
            "\xff"
            "b",
            " \xff\xff!\xc3"}},
          {kMarks, {kCafe, " JSONParser", " Hello", "World"}},
          // Han never joins other letters; unlike GPT-4o, no slash after a symbol run's breaks.
          {"Hello\u4e16\u754cabc DEF's", {"Hello", "\u4e16\u754c", "abc", " DEF's"}},
          {"a!\n/b", {"a", "!\n", "/b"}},
          {" \u4e16x", {" ", "\u4e16", "x"}}}},
        {"superbpe",
         {{kDigits, kDigitsFromEnd},
          {kContractions, {kContractions}},
          {kCjk, {kCjk}},
          {kEmoji, {kEmoji}},
          {kSpaces, {kSpaces}},
          {kTabs, {kTabs}},
          {kPunct, {kPunct}},
          {kInvalid, {kInvalid}},
          {kMarks, {kMarks}},
          {"a 1234567 b", {"a ", "1", "234", "567", " b"}},
          {"123456", {"123", "456"}}}},
        {"bailingmoe",
         {{kDigits, kDigitsOne},
          {kContractions, {"it", "'s", " IT", "'S", " we", "'re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid,
           {"a",
            "\xff"
            "b",
            " \xff\xff!\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}}}},
        {"seed-coder",
         {{kDigits, kDigitsOne},
          {kContractions, {"it", "'s", " IT", "'S", " we", "'re"}},
          {kCjk, {kHan, kSpaceHangul}},
          {kEmoji, {kFamily, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid,
           {"a",
            "\xff"
            "b",
            " \xff\xff!\xc3"}},
          {kMarks, {"cafe", kMark, " JSONParser", " HelloWorld"}},
          // Unlike Llama 3, a symbol run leaves the line breaks after it alone.
          {"a!\n\nb", {"a", "!", "\n\n", "b"}}}},
        {"afmoe",
         {{kDigits, kDigitsFromEnd},
          {kContractions, {"it", "'s", " IT", "'S", " we", "'re"}},
          {kCjk, {kHan, " ", kHangul}},
          {kEmoji, {kMan, kZwj, kWoman, kZwj, kGirl, " ok"}},
          {kSpaces, kSpacesLlama3},
          {kTabs, kTabsLlama3},
          {kPunct, {"x", "...!?", " y"}},
          {kInvalid, {"a", "\xff", "b", " \xff\xff!\xc3"}},
          {kMarks, {kCafe, " JSONParser", " HelloWorld"}},
          // Lao and hiragana runs stand alone like the ideographs.
          {"a\u0ea5\u0eb2\u0ea7b\u3072\u3089", {"a", "\u0ea5\u0eb2\u0ea7", "b", "\u3072\u3089"}}}},
    };
    return kTables;
}

}  // namespace

TEST_CASE("tokenizer: pre-tokenizer families split hard cases as their expressions say") {
    for (const FamilyCases& f : familyTables()) {
        CAPTURE(std::string(f.name));
        auto p = make(f.name);
        for (const Case& c : f.cases) {
            CAPTURE(std::string(c.text));
            CHECK(splitWith(*p, c.text) == c.pieces);
        }
    }
}

TEST_CASE("tokenizer: every pre-tokenizer name resolves to its family") {
    // Each alias splits a text that tells the families apart exactly as its family does.
    std::string probe;
    for (const char* t : {kDigits, kContractions, kCjk, kEmoji, kSpaces, kTabs, kPunct, kInvalid,
                          kMarks, "a!\n/b\n\n", "f(x)|y <sentinel:1>"})
        probe += std::string(t) + " ";
    const std::pair<const char*, std::vector<const char*>> groups[] = {
        {"gpt2",
         {"gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "jina-es",
          "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe",
          "gigachat", "a.x-4.0", "mellum", "exaone4", "modern-bert"}},
        {"llama3",
         {"llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
          "jina-v5-nano", "dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}},
        {"qwen2",
         {"deepseek-r1-qwen", "megrez", "kormo", "f2llmv2", "stablelm2", "hunyuan", "grok-2",
          "solar-open"}},
        {"deepseek-v3", {"hunyuan-dense", "joyai-llm"}},
        {"starcoder", {"refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}},
        {"bloom", {"poro-chat", "gpt3-finnish"}},
        {"gpt-4o", {"llama4", "minimax-m2", "kanana2", "talkie"}},
        {"bailingmoe", {"bailingmoe2", "llada-moe"}},
    };
    size_t named = 0;
    for (const auto& [family, aliases] : groups) {
        const std::vector<std::string> expected = splitWith(*make(family), probe);
        for (const char* alias : aliases) {
            CAPTURE(std::string(alias));
            CHECK(splitWith(*make(alias), probe) == expected);
        }
        named += 1 + aliases.size();
    }
    // Every other name is a family of its own, tested above; the two lists together are all.
    const std::vector<std::string> names = PreTokenizer::supportedNames();
    size_t families_only = 0;
    for (const FamilyCases& f : familyTables()) {
        bool in_groups = false;
        for (const auto& [family, aliases] : groups) in_groups |= std::string(family) == f.name;
        families_only += in_groups || std::string(f.name) == "dbrx" ? 0 : 1;
    }
    CHECK(names.size() == named + families_only);
    for (const FamilyCases& f : familyTables())
        CHECK(std::find(names.begin(), names.end(), f.name) != names.end());
    // No name listed twice.
    std::vector<std::string> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
}

TEST_CASE("tokenizer: pre-tokenizer flags: whole-word tokens, BOS and SEP by family") {
    struct Flags {
        const char* name;
        bool ignore_merges, add_bos, add_sep;
    };
    const Flags cases[] = {
        {"llama3", true, true, false},        {"llama-bpe", true, true, false},
        {"pixtral", true, true, false},       {"tekken", true, true, false},
        {"chameleon", false, true, false},    {"dbrx", false, false, false},
        {"chatglm-bpe", false, false, false}, {"gpt2", false, false, false},
        {"qwen2", false, false, false},       {"gpt-4o", false, false, false},
        {"superbpe", false, false, false},    {"default", false, false, false},
        {"roberta-bpe", false, false, true},  {"jina-v2-code", false, false, true},
    };
    for (const Flags& c : cases) {
        CAPTURE(std::string(c.name));
        auto p = make(c.name);
        CHECK(p->ignoreMerges() == c.ignore_merges);
        CHECK(p->addBos() == c.add_bos);
        CHECK(p->addSep() == c.add_sep);
    }
}

TEST_CASE("tokenizer: an unknown pre-tokenizer is refused with the list of known ones") {
    for (const char* name : {"", "llama-3", "GPT2", "qwen2 ", "whitespace"}) {
        CAPTURE(std::string(name));
        auto p = PreTokenizer::create(name);
        REQUIRE_FALSE(p.isOk());
        CHECK(p.message().find("is not supported") != std::string::npos);
        for (const char* known : {"default", "llama3", "tekken", "gpt-4o", "kimi-k2", "afmoe"})
            CHECK(p.message().find(known) != std::string::npos);
    }
}

TEST_CASE("tokenizer: pre-tokenizers cover random bytes exactly and never crash") {
    // Bytes drawn from ASCII, UTF-8 lead and continuation bytes and whole multi-byte characters,
    // so both valid text and every kind of broken sequence occur.
    std::mt19937_64 rng(11);
    const std::string alphabet[] = {"a",      "Z",          "7",      " ",     "\n",   "\r",
                                    "\t",     "'",          "!",      "/",     "\xc3", "\xa9",
                                    "\xe4",   "\xb8",       "\xf0",   "\x9f",  "\xff", "\u00e9",
                                    "\u4e2d", "\U0001F600", "\u200D", "\u0301"};
    for (const std::string& name : PreTokenizer::supportedNames()) {
        CAPTURE(name);
        auto p = make(name);
        for (int round = 0; round < 40; ++round) {
            std::string text;
            size_t n = rng() % 40;
            for (size_t i = 0; i < n; ++i) text += alphabet[rng() % std::size(alphabet)];
            std::vector<std::string_view> pieces;
            p->split(text, pieces);
            std::string joined;
            for (std::string_view v : pieces) {
                CHECK_FALSE(v.empty());
                joined += v;
            }
            CHECK(joined == text);
        }
    }
}

}  // namespace blue
