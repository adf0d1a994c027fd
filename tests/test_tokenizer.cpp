// Tests of the tokenizers: llama.cpp's published vocabulary vectors (every string must encode to
// exactly the expected ids and decode back), the stories260K model's greedy output, special
// tokens, streaming decoding against batch decoding, arbitrary bytes, hand-made vocabularies
// that pin down merge order, malformed vocabularies with their messages, and a seeded mutation
// test of the loader.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "compiler/gguf.h"
#include "compiler/tokenizer.h"
#include "tests/test_paths.h"

namespace blue {
namespace {

std::string readText(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

Tokenizer loadTokenizer(const std::string& path) {
    Result<GgufFile> f = ggufOpen(path);
    REQUIRE_MESSAGE(f.isOk(), f.message());
    Result<Tokenizer> t = Tokenizer::fromGguf(*f);
    REQUIRE_MESSAGE(t.isOk(), t.message());
    return std::move(t).value();
}

std::string vocabPath(const std::string& name) {
    return test::sharedDir() + "/vocab/ggml-vocab-" + name + ".gguf";
}

Tokenizer loadVocab(const std::string& name) {
    return loadTokenizer(vocabPath(name));
}

std::string storiesDir() {
    return test::sharedDir() + "/models/stories260K";
}

struct VocabCase {
    std::string text;
    std::vector<int32_t> ids;
};

// The .inp file holds strings each followed by "\n__ggml_vocab_test__\n"; the .out file one line
// of space-separated ids per string.
std::vector<VocabCase> readVocabCases(const std::string& name) {
    std::string inp = readText(vocabPath(name) + ".inp");
    std::string out = readText(vocabPath(name) + ".out");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<VocabCase> cases;
    size_t pos = 0;
    for (size_t m; (m = inp.find(sep, pos)) != std::string::npos; pos = m + sep.size())
        cases.push_back({inp.substr(pos, m - pos), {}});
    REQUIRE(pos == inp.size());
    std::istringstream lines(out);
    std::string line;
    size_t i = 0;
    for (; std::getline(lines, line); ++i) {
        REQUIRE(i < cases.size());
        std::istringstream ids(line);
        for (int32_t id; ids >> id;) cases[i].ids.push_back(id);
    }
    REQUIRE(i == cases.size());
    return cases;
}

std::string idList(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += " " + std::to_string(id);
    return s;
}

bool isValidUtf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        uint8_t c = uint8_t(s[i]);
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3
                                 : c >= 0xF0 && c < 0xF5 ? 4
                                                         : 0;
        if (len == 0 || i + len > s.size()) return false;
        for (size_t k = 1; k < len; ++k)
            if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

// Streams `ids` token by token; checks every chunk ends on a character boundary when the whole
// text is valid UTF-8, and returns the concatenation.
std::string streamDecode(const Tokenizer& t, const std::vector<int32_t>& ids, bool render_special,
                         bool at_start = true) {
    TokenStreamDecoder d(t, render_special, at_start);
    std::string all;
    std::string expect = t.decode(ids, render_special);
    for (int32_t id : ids) {
        std::string chunk = d.push(id);
        if (isValidUtf8(expect)) CHECK_MESSAGE(isValidUtf8(chunk), "chunk after token " << id);
        all += chunk;
    }
    all += d.finish();
    CHECK(d.heldBytes() == 0);
    return all;
}

}  // namespace

TEST_CASE("tokenizer: llama.cpp vocabulary vectors encode exactly and decode back") {
    struct Vocab {
        const char* name;
        int32_t bos;
        bool add_bos;
    };
    // The published ids carry no BOS (the first string, "ied 4 ½ months", starts with "▁ied" /
    // "ied"): they are what encode(text, add_special = false, parse_special = false) returns.
    for (const Vocab& v : {Vocab{"llama-spm", 1, true}, Vocab{"phi-3", 1, true},
                           Vocab{"gpt-2", 50256, false}, Vocab{"deepseek-coder", 32013, true}}) {
        CAPTURE(v.name);
        Tokenizer t = loadVocab(v.name);
        std::vector<VocabCase> cases = readVocabCases(v.name);
        REQUIRE(cases.size() == 46);
        CHECK(t.bos() == v.bos);
        CHECK(t.addBos() == v.add_bos);
        REQUIRE_FALSE(cases[0].ids.empty());
        CHECK(cases[0].ids[0] != t.bos());
        int encoded = 0, decoded = 0;
        for (size_t i = 0; i < cases.size(); ++i) {
            const VocabCase& c = cases[i];
            CAPTURE(i);
            CAPTURE(c.text);
            std::vector<int32_t> got = t.encode(c.text, false, false);
            CHECK_MESSAGE(got == c.ids, "expected" << idList(c.ids) << "\ngot     " << idList(got));
            encoded += got == c.ids;
            std::vector<int32_t> with_bos = t.encode(c.text, true, false);
            std::vector<int32_t> expect_bos = c.ids;
            if (v.add_bos) expect_bos.insert(expect_bos.begin(), v.bos);
            CHECK(with_bos == expect_bos);
            std::string back = t.decode(c.ids);
            CHECK(back == c.text);
            decoded += back == c.text;
            CHECK(t.decode(with_bos) == c.text);  // a leading BOS does not take the space strip
        }
        MESSAGE(v.name << ": " << encoded << "/" << cases.size() << " vectors encode exactly, "
                       << decoded << "/" << cases.size() << " decode back");
    }
}

TEST_CASE("tokenizer: vocabulary metadata and accessors") {
    Tokenizer s = loadTokenizer(storiesDir() + "/stories260K.gguf");
    CHECK(s.model() == TokenizerModel::Spm);
    CHECK(s.vocabSize() == 512);
    CHECK(s.bos() == 1);
    CHECK(s.eos() == 2);
    CHECK(s.unk() == 0);
    CHECK(s.pad() == kNoToken);  // stored as 0xFFFFFFFF
    CHECK(s.eot() == kNoToken);
    CHECK(s.addBos());
    CHECK_FALSE(s.addEos());
    CHECK(s.addSpacePrefix());
    CHECK(s.isEog(2));
    CHECK_FALSE(s.isEog(1));
    CHECK_FALSE(s.isEog(-1));
    CHECK_FALSE(s.isEog(512));
    CHECK(s.isControl(1));
    CHECK_FALSE(s.isControl(403));
    CHECK(s.tokenType(0) == TokenType::Unknown);
    CHECK(s.tokenType(3) == TokenType::Byte);
    CHECK(s.tokenType(9999) == TokenType::Undefined);
    CHECK(s.tokenText(3) == "<0x00>");
    CHECK(s.tokenText(403) == "\xe2\x96\x81Once");
    CHECK(s.tokenText(-5).empty());
    CHECK(s.piece(403) == " Once");
    CHECK(s.piece(13) == "\n");  // <0x0A>
    CHECK(s.piece(1).empty());
    CHECK(s.piece(1, true) == "<s>");
    CHECK(s.findToken("\xe2\x96\x81Once") == 403);
    CHECK(s.findToken("Once upon") == kNoToken);

    Tokenizer g = loadVocab("gpt-2");
    CHECK(g.model() == TokenizerModel::Bpe);
    CHECK(g.preTokenizer() == "gpt-2");
    CHECK(g.vocabSize() == 50257);
    CHECK(g.eos() == 50256);
    CHECK(g.eot() == 50256);  // <|endoftext|>
    CHECK(g.isEog(50256));
    CHECK_FALSE(g.addSpacePrefix());
    CHECK(g.piece(g.findToken("\xc4\xa0world")) == " world");  // Ġworld

    Tokenizer p = loadVocab("phi-3");
    CHECK(p.eos() == 32000);
    CHECK(p.tokenText(p.eot()) == "<|end|>");
    CHECK(p.isEog(32000));
    CHECK(p.isEog(p.eot()));
    CHECK_FALSE(p.isEog(32010));  // <|user|>

    Tokenizer d = loadVocab("deepseek-coder");
    CHECK(d.preTokenizer() == "deepseek-coder");
    CHECK(d.eos() == 32014);
    CHECK(d.isEog(32014));
    CHECK(d.tokenType(32000) == TokenType::UserDefined);
}

TEST_CASE("tokenizer: stories260K greedy output decodes to the expected text") {
    Tokenizer t = loadTokenizer(storiesDir() + "/stories260K.gguf");
    std::string file = readText(storiesDir() + "/expected_greedy_bos_256.txt");
    size_t nl = file.find('\n');
    REQUIRE(nl != std::string::npos);
    std::vector<int32_t> ids;
    std::istringstream line(file.substr(0, nl));
    for (int32_t id; line >> id;) ids.push_back(id);
    REQUIRE(ids.size() == 256);
    // The ids are the generated tokens that followed the BOS prompt; the text file ends its last
    // line with a newline that is not part of the output.
    std::string text = file.substr(nl + 1);
    REQUIRE(!text.empty());
    REQUIRE(text.back() == '\n');
    text.pop_back();
    CHECK(t.decode(ids) == text);
    std::vector<int32_t> with_bos = ids;
    with_bos.insert(with_bos.begin(), t.bos());
    CHECK(t.decode(with_bos) == text);
    CHECK(streamDecode(t, ids, false) == text);
    CHECK(streamDecode(t, with_bos, false) == text);
    CHECK(t.decode(with_bos, true) == "<s> " + text);  // rendered BOS takes the space strip
    CHECK(text.rfind("Once upon a time, there was a little girl named Lily.", 0) == 0);
}

TEST_CASE("tokenizer: stories260K encode/decode round trips") {
    Tokenizer t = loadTokenizer(storiesDir() + "/stories260K.gguf");
    const char* texts[] = {
        "Once upon a time, there was a little girl named Lily.",
        "",
        " ",
        "  leading spaces and trailing  ",
        "Lily said, \"I can't find it!\"\nShe was sad.\n\n",
        "caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 100 \xf0\x9f\xa6\x99 \xe4\xbd\xa0\xe5\xa5\xbd",
        "tab\there",
    };
    for (const char* text : texts) {
        CAPTURE(text);
        std::vector<int32_t> ids = t.encode(text, false, false);
        CHECK(t.decode(ids) == text);
        std::vector<int32_t> bos_ids = t.encode(text, true, false);
        REQUIRE(!bos_ids.empty());
        CHECK(bos_ids[0] == 1);
        CHECK(t.decode(bos_ids) == text);
        for (int32_t id : ids) CHECK(t.isValid(id));
    }
    // Characters outside the 512-token vocabulary fall back to their UTF-8 bytes.
    std::vector<int32_t> llama = t.encode("\xf0\x9f\xa6\x99", false, false);
    REQUIRE(llama.size() == 5);
    CHECK(t.tokenText(llama[0]) == "\xe2\x96\x81");
    CHECK(t.tokenText(llama[1]) == "<0xF0>");
    CHECK(t.tokenText(llama[2]) == "<0x9F>");
    CHECK(t.tokenText(llama[3]) == "<0xA6>");
    CHECK(t.tokenText(llama[4]) == "<0x99>");
    CHECK(t.encode("Once", false, false) == std::vector<int32_t>{403});
}

TEST_CASE("tokenizer: special tokens") {
    Tokenizer p = loadVocab("phi-3");
    const int32_t user = p.findToken("<|user|>"), end = p.findToken("<|end|>");
    REQUIRE(user == 32010);
    std::vector<int32_t> hi = p.encode("Hi", false, false);  // "▁Hi": the space prefix
    std::vector<int32_t> parsed = p.encode("<|user|>Hi<|end|>", false, true);
    std::vector<int32_t> expect = {user};
    expect.insert(expect.end(), hi.begin(), hi.end());
    expect.push_back(end);
    CHECK(parsed == expect);
    // Phi-3's special tokens swallow the whitespace after them.
    CHECK(p.encode("<|user|>\n  Hi<|end|>", false, true) == expect);
    std::vector<int32_t> literal = p.encode("<|user|>Hi", false, false);
    CHECK(std::find(literal.begin(), literal.end(), user) == literal.end());
    CHECK(p.decode(literal) == "<|user|>Hi");
    CHECK(p.decode(parsed) == "Hi");
    CHECK(p.decode(parsed, true) == "<|user|> Hi<|end|>");

    Tokenizer g = loadVocab("gpt-2");
    CHECK(g.encode("a<|endoftext|>b", false, true) ==
          std::vector<int32_t>{g.findToken("a"), 50256, g.findToken("b")});
    CHECK(g.encode("<|endoftext|>", false, false).size() > 1);

    // User-defined tokens are recognised even without parse_special.
    Tokenizer d = loadVocab("deepseek-coder");
    const std::string hole = "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>";
    int32_t hole_id = d.findToken(hole);
    REQUIRE(hole_id == 32015);
    std::vector<int32_t> ids = d.encode("x" + hole + "y", false, false);
    CHECK(ids == std::vector<int32_t>{d.findToken("x"), hole_id, d.findToken("y")});
    CHECK(d.decode(ids) == "x" + hole + "y");
}

TEST_CASE("tokenizer: streaming decoder equals batch decode") {
    Tokenizer s = loadTokenizer(storiesDir() + "/stories260K.gguf");
    // U+1F999 as four byte-fallback tokens: nothing comes out until the character is complete.
    std::vector<int32_t> ids = s.encode("a \xf0\x9f\xa6\x99 b \xc3\xbc", false, false);
    TokenStreamDecoder dec(s);
    std::string out;
    std::vector<std::string> chunks;
    for (int32_t id : ids) chunks.push_back(dec.push(id));
    out = std::accumulate(chunks.begin(), chunks.end(), std::string()) + dec.finish();
    CHECK(out == "a \xf0\x9f\xa6\x99 b \xc3\xbc");
    CHECK(std::count(chunks.begin(), chunks.end(), "\xf0\x9f\xa6\x99") == 1);
    CHECK(std::count(chunks.begin(), chunks.end(), "\xc3\xbc") == 1);

    TokenStreamDecoder partial(s);
    CHECK(partial.push(s.findToken("<0xF0>")) == "");
    CHECK(partial.push(s.findToken("<0x9F>")) == "");
    CHECK(partial.heldBytes() == 2);
    CHECK(partial.finish() == "\xf0\x9f");  // an unfinished character is handed back at the end
    // A stray continuation byte can never complete: it is passed through at once.
    TokenStreamDecoder stray(s);
    CHECK(stray.push(s.findToken("<0x80>")) == "\x80");

    // Continuing after a prompt keeps the leading space.
    TokenStreamDecoder cont(s, false, false);
    CHECK(cont.push(403) == " Once");
    TokenStreamDecoder start(s);
    CHECK(start.push(1) == "");
    CHECK(start.push(403) == "Once");

    const char* texts[] = {
        "Hello, y'all! How are you \xf0\x9f\x98\x81 ?\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8" "apple",
        "\xe1\x9e\x80\xe1\x9e\xb6\xe1\x9e\x93\xe1\x9f\x8b \xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe",
        "  two spaces, then \xf0\x9f\x9a\x80\xf0\x9f\xa6\x99\n\ttabs",
    };
    for (std::string name : {"llama-spm", "phi-3", "gpt-2", "deepseek-coder"}) {
        CAPTURE(name);
        Tokenizer t = loadVocab(name);
        for (const char* text : texts) {
            CAPTURE(text);
            std::vector<int32_t> v = t.encode(text, true, true);
            CHECK(streamDecode(t, v, false) == t.decode(v));
            CHECK(streamDecode(t, v, true) == t.decode(v, true));
            std::string prefix = t.addSpacePrefix() ? " " : "";
            CHECK(streamDecode(t, v, false, false) == prefix + t.decode(v));
            CHECK(t.decode(v) == text);
        }
    }
}

TEST_CASE("tokenizer: arbitrary bytes, invalid UTF-8 included, round trip") {
    std::mt19937 rng(1234);
    std::string common = {'a', 'b', ' ', ' ', '\n', '1', '\'', '.', char(0x80), char(0xBF),
                          char(0xC3), char(0xE2), char(0xF0), char(0x9F)};
    // Bytes that never occur in UTF-8 (C0, FF, ...). DeepSeek Coder's vocabulary has them only as
    // user-defined tokens whose text is the byte-level character ("À", "ÿ"), which
    // decode as that text, so it cannot represent these bytes.
    std::string never_utf8 = {char(0xC0), char(0xFF)};
    for (std::string name : {"llama-spm", "gpt-2", "deepseek-coder"}) {
        CAPTURE(name);
        Tokenizer t = loadVocab(name);
        std::string alphabet = name == "deepseek-coder" ? common : common + never_utf8;
        for (int iter = 0; iter < 200; ++iter) {
            std::string text(rng() % 24, ' ');
            for (char& c : text) c = alphabet[rng() % alphabet.size()];
            CAPTURE(text);
            std::vector<int32_t> ids = t.encode(text, false, true);
            for (int32_t id : ids) REQUIRE(t.isValid(id));
            CHECK(t.decode(ids) == text);
            CHECK(streamDecode(t, ids, false) == text);
        }
    }
}

}  // namespace blue
