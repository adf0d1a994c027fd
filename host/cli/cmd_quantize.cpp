// `bluevm quantize IN.gguf OUT.gguf --type T`: rewrites a model with quantized weight matrices
// (compiler/quantize.h), with a progress bar on a terminal and a one-line summary.
#include <chrono>
#include <cstdio>
#include <memory>

#include "compiler/quantize.h"
#include "host/cli/commands.h"
#include "host/cli/progress.h"

namespace blue::cli {

namespace {

struct QuantizeArgs {
    std::string in, out, type;
    uint32_t threads = 0;
    bool pure = false;
};

int runQuantize(const QuantizeArgs& args) {
    std::optional<QuantizeTarget> type = quantizeTargetFromName(args.type);
    if (!type) {
        return fail("quantize: unknown --type '" + args.type +
                    "' (choose one of: " + quantizeTypeNames() + ")");
    }
    ProgressBar bar("quantizing");
    QuantizeOptions opt;
    opt.threads = args.threads;
    opt.pure = args.pure;
    opt.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
    opt.on_note = [](const std::string& note) { std::fprintf(stderr, "note: %s\n", note.c_str()); };
    auto start = std::chrono::steady_clock::now();
    Result<QuantizeReport> report = quantizeGguf(args.in, args.out, *type, opt);
    bar.finish();
    if (!report) return fail("quantize: " + report.message());
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s -> %s (%s, file_type %u): %zu tensors: %s; %.2f MB -> %.2f MB; %.3f s\n",
                args.in.c_str(), args.out.c_str(), args.type.c_str(), report->file_type,
                report->tensors.size(), report->typeSummary().c_str(),
                double(report->file_bytes_in) / 1e6, double(report->file_bytes_out) / 1e6, seconds);
    return 0;
}

}  // namespace

Command addQuantizeCommand(CLI::App& app) {
    auto args = std::make_shared<QuantizeArgs>();
    CLI::App* sub = app.add_subcommand("quantize", "Quantize the weights of a GGUF model");
    sub->add_option("input", args->in, "the model (GGUF)")->required();
    sub->add_option("output", args->out, "the GGUF file to write")->required();
    sub->add_option("--type,-t", args->type, "target type: " + quantizeTypeNames())->required();
    sub->add_option("--threads", args->threads, "worker threads (default: all cores)")
        ->check(CLI::Range(1u, 1024u));
    sub->add_flag("--pure", args->pure,
                  "every weight matrix in --type (no llama.cpp-style mix; row fallbacks remain)");
    return [args] { return runQuantize(*args); };
}

}  // namespace blue::cli
