// blue-synth: writes a synthetic GGUF model (random weights, real shapes) for benchmarks and tests.
//   blue-synth --preset stories110M -o models/stories110M.gguf [--type q4_0] [--seed 7]
//   blue-synth --preset stories15M --layers 2 --dim 64 --vocab 300 -o tiny.gguf
//   blue-synth --list
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "compiler/quantize.h"
#include "host/cli/progress.h"
#include "tools/synth/synth.h"

namespace {

struct Args {
    std::string preset, out, type = "f32";
    uint64_t seed = 1;
    uint32_t threads = 0;
    bool pure = false, list = false, tied = false, untied = false;
    std::optional<uint32_t> layers, dim, ff, vocab, ctx, heads, kv_heads, experts, experts_used;
    std::optional<uint32_t> shared_ff;
};

int fail(const std::string& message) {
    std::fprintf(stderr, "blue-synth: %s\n", message.c_str());
    return 1;
}

std::string describe(const blue::SynthConfig& c) {
    std::string s = blue::strFormat("%s: %s, dim %u, %u layers, %u heads (%u kv), ff %u, vocab %u",
                                    c.name.c_str(), c.arch.c_str(), c.dim, c.n_layer, c.n_head,
                                    c.n_head_kv, c.n_ff, c.n_vocab);
    if (c.n_expert) s += blue::strFormat(", %u experts top-%u", c.n_expert, c.n_expert_used);
    if (c.n_ff_shexp) s += blue::strFormat(", shared expert ff %u", c.n_ff_shexp);
    if (c.qkv_bias) s += ", qkv bias";
    if (c.qkNorm()) s += ", qk norm";
    s += c.tied_output ? ", tied output" : ", separate output";
    return s + blue::strFormat(": %.2fM parameters", double(blue::synthParamCount(c)) / 1e6);
}

void applyOverrides(const Args& a, blue::SynthConfig& c) {
    if (a.layers) c.n_layer = *a.layers;
    if (a.dim) c.dim = *a.dim;
    if (a.ff) c.n_ff = *a.ff;
    if (a.vocab) c.n_vocab = *a.vocab;
    if (a.ctx) c.n_ctx = *a.ctx;
    if (a.heads) c.n_head = *a.heads;
    if (a.kv_heads) c.n_head_kv = *a.kv_heads;
    if (a.heads && !a.kv_heads && c.n_head_kv > c.n_head) c.n_head_kv = c.n_head;
    if (a.experts) {
        if (c.n_expert == 0 && *a.experts > 0) c.n_expert_used = 2;
        c.n_expert = *a.experts;
        c.n_expert_used = c.n_expert ? std::min(c.n_expert_used, c.n_expert) : 0;
    }
    if (a.experts_used) c.n_expert_used = *a.experts_used;
    if (a.shared_ff) c.n_ff_shexp = *a.shared_ff;
    if (a.tied) c.tied_output = true;
    if (a.untied) c.tied_output = false;
}

int run(const Args& a) {
    if (a.list) {
        for (std::string_view name : blue::synthPresetNames()) {
            std::printf("%s\n", describe(*blue::synthPreset(name)).c_str());
        }
        return 0;
    }
    if (a.preset.empty() || a.out.empty()) return fail("--preset and -o are required (or --list)");
    std::optional<blue::SynthConfig> config = blue::synthPreset(a.preset);
    if (!config) return fail("unknown preset '" + a.preset + "' (see --list)");
    applyOverrides(a, *config);
    std::optional<blue::QuantizeTarget> type = blue::quantizeTargetFromName(a.type);
    if (type && blue::QuantizeTarget(type->type) != *type) {
        return fail("--type '" + a.type + "': blue-synth writes each type's default mix (q3_k_m, q4_k_m, q5_k_m); " +
                    "for another size, quantize its f32 output with bluevm quantize --type " + a.type);
    }
    if (!type) {
        return fail("unknown --type '" + a.type + "' (choose one of: " + blue::quantizeTypeNames() +
                    ")");
    }
    if (blue::Status s = blue::synthValidate(*config); !s) return fail(s.message());
    std::printf("%s\n", describe(*config).c_str());
    std::fflush(stdout);

    blue::cli::ProgressBar bar("writing");
    blue::SynthOptions opt;
    opt.type = type->type;
    opt.pure = a.pure;
    opt.seed = a.seed;
    opt.threads = a.threads;
    opt.progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
    auto start = std::chrono::steady_clock::now();
    blue::Status s = blue::synthWrite(*config, opt, a.out);
    bar.finish();
    if (!s) return fail(s.message());
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::error_code ec;
    double mb = double(std::filesystem::file_size(a.out, ec)) / 1e6;
    std::printf("wrote %s (%s): %.1f MB in %.2f s (%.1f MB/s)\n", a.out.c_str(), a.type.c_str(), mb,
                seconds, seconds > 0 ? mb / seconds : 0.0);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"blue-synth: synthetic GGUF models with random weights and real shapes"};
    Args a;
    app.add_option("--preset,-p", a.preset, "model shape (see --list)");
    app.add_option("-o,--output", a.out, "the GGUF file to write");
    app.add_option("--type,-t", a.type, "weight type: " + blue::quantizeTypeNames());
    app.add_option("--seed", a.seed, "random seed (same seed, same bytes)");
    app.add_option("--threads", a.threads, "worker threads (default: all cores)")
        ->check(CLI::Range(1u, 1024u));
    app.add_flag("--pure", a.pure, "every matrix in --type (no llama.cpp-style mix)");
    app.add_flag("--list", a.list, "print the presets and exit");
    app.add_option("--layers", a.layers, "override: layers");
    app.add_option("--dim", a.dim, "override: embedding width");
    app.add_option("--ff", a.ff, "override: FFN width (per expert in MoE models)");
    app.add_option("--vocab", a.vocab, "override: vocabulary size (>= 260)");
    app.add_option("--ctx", a.ctx, "override: context length");
    app.add_option("--heads", a.heads, "override: attention heads");
    app.add_option("--kv-heads", a.kv_heads, "override: KV heads");
    app.add_option("--experts", a.experts, "override: experts (0: dense)");
    app.add_option("--experts-used", a.experts_used, "override: experts per token");
    app.add_option("--shared-ff", a.shared_ff, "override: shared expert width (qwen2moe)");
    app.add_flag("--tied", a.tied, "override: no output.weight (logits use token_embd)");
    app.add_flag("--untied", a.untied, "override: a separate output.weight");
    CLI11_PARSE(app, argc, argv);
    return run(a);
}
