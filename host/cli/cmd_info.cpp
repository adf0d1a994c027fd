// `bluevm info MODEL.gguf`: architecture, hyperparameters, tokenizer, tensors.
#include <cstdio>

#include "compiler/gguf.h"
#include "compiler/model_config.h"
#include "host/cli/commands.h"

namespace blue::cli {

Command addInfoCommand(CLI::App& app) {
    auto path = std::make_shared<std::string>();
    CLI::App* sub = app.add_subcommand("info", "Describe a GGUF model: architecture, tokenizer, tensors");
    sub->add_option("model", *path, "the GGUF file")->required();
    return [path] {
        auto g = ggufOpen(*path);
        if (!g) return fail(g.message());
        std::string text = ggufDescribe(g.value());
        std::fwrite(text.data(), 1, text.size(), stdout);
        return 0;
    };
}

}  // namespace blue::cli
