// `bluevm tokenize` and `bluevm detokenize`: the model's tokenizer on its own. Both work on
// vocabulary-only GGUF files.
#include <cstdio>
#include <sstream>

#include "compiler/gguf.h"
#include "compiler/tokenizer.h"
#include "host/cli/commands.h"

namespace blue::cli {

namespace {

struct TokenizeArgs {
    std::string model, text, ids;
    bool bos = false, special = false, pieces = false;
};

Result<Tokenizer> openTokenizer(const std::string& path) {
    auto g = ggufOpen(path);
    if (!g) return g.status();
    return Tokenizer::fromGguf(g.value());
}

}  // namespace

Command addTokenizeCommand(CLI::App& app) {
    auto a = std::make_shared<TokenizeArgs>();
    CLI::App* sub = app.add_subcommand("tokenize", "Print the token ids of a text");
    sub->add_option("--model,-m", a->model, "GGUF model or vocabulary")->required();
    sub->add_option("--text,-t", a->text, "the text")->required();
    sub->add_flag("--bos", a->bos, "add BOS/EOS as the vocabulary asks");
    sub->add_flag("--special", a->special, "recognise special-token text such as <|im_start|>");
    sub->add_flag("--pieces", a->pieces, "print each id with its vocabulary text");
    return [a] {
        auto tok = openTokenizer(a->model);
        if (!tok) return fail(tok.message());
        std::vector<int32_t> ids = tok->encode(a->text, a->bos, a->special);
        for (size_t i = 0; i < ids.size(); ++i) {
            if (a->pieces) {
                std::printf("%d\t%s\n", ids[i], std::string(tok->tokenText(ids[i])).c_str());
            } else {
                std::printf("%s%d", i ? " " : "", ids[i]);
            }
        }
        if (!a->pieces) std::printf("\n");
        return 0;
    };
}

Command addDetokenizeCommand(CLI::App& app) {
    auto a = std::make_shared<TokenizeArgs>();
    CLI::App* sub = app.add_subcommand("detokenize", "Print the text of token ids");
    sub->add_option("--model,-m", a->model, "GGUF model or vocabulary")->required();
    sub->add_option("--ids", a->ids, "token ids separated by spaces or commas")->required();
    sub->add_flag("--special", a->special, "include the text of control tokens");
    return [a] {
        auto tok = openTokenizer(a->model);
        if (!tok) return fail(tok.message());
        std::string text = a->ids;
        for (char& c : text) if (c == ',') c = ' ';
        std::istringstream ss(text);
        std::vector<int32_t> ids;
        std::string word;
        while (ss >> word) {
            char* end = nullptr;
            long v = std::strtol(word.c_str(), &end, 10);
            if (*end || v < 0 || v >= tok->vocabSize()) {
                return fail("'" + word + "' is not a token id of this vocabulary (0.." +
                            std::to_string(tok->vocabSize() - 1) + ")");
            }
            ids.push_back(int32_t(v));
        }
        std::string out = tok->decode(ids, a->special);
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::printf("\n");
        return 0;
    };
}

}  // namespace blue::cli
