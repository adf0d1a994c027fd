// `bluevm generate`: text generation with a GGUF model (or a lowered .bir) on the GPU VM.
//   one prompt:    --prompt TEXT, streamed to stdout as it is produced
//   many prompts:  --prompts FILE (one per line, or JSONL objects with per-prompt parameters),
//                  results as JSONL, --instances N instances serving them together
//   conversations: --kv-save F keeps the KV cache of a --prompt run; --kv-load F continues one
//                  (the prompt is appended; an empty prompt goes on generating)
//   log-probabilities: --logprobs N prints each generated token's log-probability and its N most
//                  likely alternatives (computed on the GPU by SAMPLE) on stderr after the text,
//                  as a table or (--logprobs-format json) one JSON object a token
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>

#include "host/cli/commands.h"
#include "host/cli/progress.h"
#include "host/llm/engine.h"
#include "host/llm/structured_output.h"
#include "vm/llm_abi.h"

namespace blue::cli {

namespace {

struct GenerateArgs {
    std::string model, prompt, prompts_file, out, device, kv_save, kv_load;
    int32_t n_predict = 256;
    SamplingParams sampling;
    bool seed_given = false;
    uint32_t instances = 1, ctx = 0, chain_cycles = 64;
    uint64_t vram_budget = 0;
    bool expert_cache = true;
    GpuOptions::HostWeights host_weights = GpuOptions::HostWeights::AUTO;
    bool stats = false, ids = false, no_echo = false, profile = false;
    int32_t logprobs = -1;  // --logprobs N: alternatives per token (-1: no log-probabilities)
    bool logprobs_given = false;
    std::string logprobs_format = "text";
    // Structured output: --grammar FILE (GBNF), --json-schema FILE, --json (any object).
    std::string grammar_file, json_schema_file;
    bool json = false;
    uint32_t grammar_words = kGrammarWordsAuto;
    uint32_t kv_page = 0, kv_pool = 0;  // paged KV (EngineOptions::kv_page, kv_pool)
    PackedGrammar grammar;  // compiled from the above before the model loads
};

using json = nlohmann::json;

// Applies --logprobs to a request: the token's own log-probability and N alternatives.
void askLogprobs(const GenerateArgs& a, GenerationRequest* r) {
    r->logprobs = a.logprobs >= 0;
    r->top_logprobs = a.logprobs > 0 ? uint32_t(a.logprobs) : 0;
    r->grammar = a.grammar;
}

// Compiles --grammar, --json-schema or --json; the message names the option and the file.
Status compileOutputOption(GenerateArgs* a, uint32_t grammar_words) {
    const int given = (a->grammar_file.empty() ? 0 : 1) + (a->json_schema_file.empty() ? 0 : 1) + (a->json ? 1 : 0);
    if (given > 1) return Status::error("--grammar, --json-schema and --json: at most one");
    if (given == 0) return Status::ok();
    OutputConstraint c;
    std::string what = "--json";
    if (a->json) {
        c.kind = ConstraintKind::JsonObject;
    } else {
        const bool gbnf = !a->grammar_file.empty();
        const std::string& path = gbnf ? a->grammar_file : a->json_schema_file;
        what = (gbnf ? "--grammar " : "--json-schema ") + path;
        std::ifstream in(path, std::ios::binary);
        if (!in) return Status::error(what + ": cannot open the file");
        c.kind = gbnf ? ConstraintKind::Grammar : ConstraintKind::JsonSchema;
        c.text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    Result<PackedGrammar> g = compileConstraint(c, grammar_words);
    if (!g) return Status::error(what + ": " + g.message());
    a->grammar = g.value();
    return Status::ok();
}

// The text a token contributes (control tokens' own text included, so EOS among the
// alternatives shows as itself).
std::string pieceText(const Engine& e, uint32_t id) {
    return std::string(e.tokenizer().piece(int32_t(id), true));
}

// A completion's log-probabilities, one object a token (keys print sorted):
// {"id", "index", "logprob", "token", "top_logprobs": [{"id", "logprob", "token"}, ...]}.
json logprobsJson(const Engine& e, const Completion& c) {
    json all = json::array();
    for (size_t i = 0; i < c.tokens.size() && i < c.logprobs.size(); ++i) {
        json top = json::array();
        for (const auto& [id, lp] : c.logprobs[i].top) {
            top.push_back({{"id", id}, {"token", pieceText(e, id)}, {"logprob", lp}});
        }
        all.push_back({{"index", i},
                       {"id", c.tokens[i]},
                       {"token", pieceText(e, c.tokens[i])},
                       {"logprob", c.logprobs[i].logprob},
                       {"top_logprobs", top}});
    }
    return all;
}

std::string dumpJson(const json& j) {
    // A byte token's piece may be part of a UTF-8 sequence: replace, never throw.
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Prints --logprobs on stderr: JSON lines, or a table with the token quoted (pieces hold spaces
// and newlines), e.g. `   1   -0.0684  " there"       | " there" -0.0684 " in" -2.9794`.
void printLogprobs(const Engine& e, const Completion& c, const std::string& format) {
    const json all = logprobsJson(e, c);
    if (format != "json")
        std::fprintf(stderr, "   #   logprob  token          | alternatives, most likely first\n");
    for (const json& t : all) {
        std::string line;
        if (format == "json") {
            line = dumpJson(t);
        } else {
            line = strFormat("%4zu %9.4f  %-14s", t["index"].get<size_t>(),
                             t["logprob"].get<double>(), dumpJson(t["token"]).c_str());
            if (!t["top_logprobs"].empty()) line += " |";
            for (const json& alt : t["top_logprobs"]) {
                line += strFormat(" %s %.4f", dumpJson(alt["token"]).c_str(),
                                  alt["logprob"].get<double>());
            }
        }
        std::fprintf(stderr, "%s\n", line.c_str());
    }
}

// Reads --prompts FILE: plain lines are prompts; lines starting with '{' are JSON objects with
// "prompt" and optional "max_tokens", "temperature", "top_k", "top_p", "min_p",
// "repeat_penalty", "seed".
Result<std::vector<std::pair<std::string, GenerationRequest>>> readPrompts(const GenerateArgs& a) {
    std::ifstream in(a.prompts_file);
    if (!in) return BLUE_ERROR("%s: cannot open prompts file", a.prompts_file.c_str());
    std::vector<std::pair<std::string, GenerationRequest>> out;
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
        if (line.empty()) continue;
        GenerationRequest r;
        r.max_new = uint32_t(a.n_predict);
        r.sampling = a.sampling;
        r.sampling.seed = a.sampling.seed + uint32_t(out.size());
        askLogprobs(a, &r);
        std::string text = line;
        if (line[0] == '{') {
            auto j = nlohmann::json::parse(line, nullptr, false);
            if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
                return BLUE_ERROR("%s:%d: expected a JSON object with a string \"prompt\"", a.prompts_file.c_str(), number);
            }
            try {
                text = j["prompt"].get<std::string>();
                r.max_new = j.value("max_tokens", r.max_new);
                r.sampling.temperature = j.value("temperature", r.sampling.temperature);
                r.sampling.top_k = j.value("top_k", r.sampling.top_k);
                r.sampling.top_p = j.value("top_p", r.sampling.top_p);
                r.sampling.min_p = j.value("min_p", r.sampling.min_p);
                r.sampling.repeat_penalty = j.value("repeat_penalty", r.sampling.repeat_penalty);
                r.sampling.seed = j.value("seed", r.sampling.seed);
            } catch (const nlohmann::json::exception& e) {
                return BLUE_ERROR("%s:%d: %s", a.prompts_file.c_str(), number, e.what());
            }
        }
        out.emplace_back(text, r);
    }
    if (out.empty()) return BLUE_ERROR("%s: no prompts", a.prompts_file.c_str());
    return out;
}

std::string statsJson(const Engine& e, size_t prompt_tokens, size_t gen_tokens, double wall_ms,
                      const std::vector<Completion>& results) {
    const GpuStats& s = e.stats();
    nlohmann::json j = nlohmann::json::parse(s.json());
    j["prompt_tokens"] = prompt_tokens;
    j["generated_tokens"] = gen_tokens;
    j["total_ms"] = wall_ms;
    j["tokens_per_second"] = s.wall_ms > 0 ? 1000.0 * double(gen_tokens) / s.wall_ms : 0.0;
    // Forward rows run: the prompt tokens and the generated tokens (each is fed back).
    if (s.expert_bytes > 0 && prompt_tokens + gen_tokens > 0) {
        j["expert_bytes_per_token"] = double(s.expert_bytes) / double(prompt_tokens + gen_tokens);
    }
    if (e.kvPages()) {  // paged KV: the pool and the most pages the run held at once
        j["kv_page"] = e.kvPage();
        j["kv_pages"] = e.kvPages();
        j["kv_pages_peak"] = e.kvPagesPeak();
        j["kv_evictions"] = e.kvEvictions();
    }
    if (results.size() > 1) {
        double per = 0;
        for (const Completion& c : results) per += double(c.tokens.size());
        j["per_request_tokens_per_second"] = s.wall_ms > 0 ? 1000.0 * per / double(results.size()) / s.wall_ms : 0.0;
    }
    return j.dump();
}

int runOne(Engine& engine, const GenerateArgs& a) {
    GenerationRequest r;
    r.max_new = uint32_t(a.n_predict);
    r.sampling = a.sampling;
    askLogprobs(a, &r);
    KvSnapshot restore, saved;
    KvRun kv;
    if (!a.kv_load.empty()) {
        auto snap = engine.readKv(a.kv_load);
        if (!snap) return fail(snap.message());
        restore = std::move(snap.value());
        kv.restore = &restore;
        r.prompt = engine.continuationTokens(a.prompt);
    } else {
        r.prompt = engine.promptTokens(a.prompt);
    }
    if (!a.kv_save.empty()) kv.save = &saved;
    auto t0 = std::chrono::steady_clock::now();
    auto results = engine.run({r}, [&](size_t, uint32_t, const std::string& text) {
        if (a.ids) return;
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
    }, kv);
    if (!results) return fail(results.message());
    if (kv.save) {
        if (Status s = engine.writeKv(saved, a.kv_save); !s) return fail(s.message());
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const Completion& c = results.value()[0];
    if (a.ids) {
        for (size_t i = 0; i < c.tokens.size(); ++i) std::printf("%s%u", i ? " " : "", c.tokens[i]);
    }
    std::printf("\n");
    std::fflush(stdout);
    if (a.logprobs >= 0) printLogprobs(engine, c, a.logprobs_format);
    if (a.stats) std::fprintf(stderr, "%s\n", statsJson(engine, r.prompt.size(), c.tokens.size(), ms, results.value()).c_str());
    return 0;
}

int runMany(Engine& engine, const GenerateArgs& a) {
    auto prompts = readPrompts(a);
    if (!prompts) return fail(prompts.message());
    std::vector<GenerationRequest> reqs;
    size_t prompt_tokens = 0;
    for (auto& [text, r] : prompts.value()) {
        r.prompt = engine.promptTokens(text);
        prompt_tokens += r.prompt.size();
        reqs.push_back(r);
    }
    auto t0 = std::chrono::steady_clock::now();
    auto results = engine.run(reqs);
    if (!results) return fail(results.message());
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    FILE* f = a.out.empty() ? stdout : std::fopen(a.out.c_str(), "w");
    if (!f) return fail("cannot write " + a.out);
    size_t gen = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
        const Completion& c = results.value()[i];
        gen += c.tokens.size();
        json j = {{"index", i},
                  {"prompt", prompts.value()[i].first},
                  {"text", c.text},
                  {"prompt_tokens", reqs[i].prompt.size()},
                  {"tokens", c.tokens.size()}};
        if (a.ids) j["ids"] = c.tokens;
        if (a.logprobs >= 0) j["logprobs"] = logprobsJson(engine, c);
        std::string line = dumpJson(j) + "\n";
        std::fwrite(line.data(), 1, line.size(), f);
    }
    if (f != stdout) std::fclose(f);
    if (a.stats) std::fprintf(stderr, "%s\n", statsJson(engine, prompt_tokens, gen, ms, results.value()).c_str());
    return 0;
}

}  // namespace

// Loading options shared by `generate` and `run M.bir --prompt`: a progress bar while the weights
// go to the device, and the prompt echoed once they are there (on the line the bar used).
void setLoading(EngineOptions* eo, ProgressBar* bar, const GenerateArgs* a) {
    eo->on_load = loadProgress(*bar, [a] {
        if (a->no_echo || a->ids || !a->prompts_file.empty()) return;
        std::fwrite(a->prompt.data(), 1, a->prompt.size(), stdout);
        std::fflush(stdout);
    });
}

int runGenerationModule(const std::string& path, const std::string& prompt, int32_t n_predict,
                        float temperature, uint32_t seed, uint32_t instances, bool stats,
                        const std::string& device) {
    GenerateArgs a;
    a.model = path;
    a.prompt = prompt;
    a.n_predict = n_predict;
    a.sampling.temperature = temperature;
    a.sampling.seed = seed;
    a.stats = stats;
    EngineOptions eo;
    eo.device = device;
    eo.instances = instances;
    ProgressBar bar("loading weights");
    setLoading(&eo, &bar, &a);
    auto engine = Engine::open(path, eo);
    if (!engine) return fail(engine.message());
    return runOne(*engine.value(), a);
}

Command addGenerateCommand(CLI::App& app) {
    auto a = std::make_shared<GenerateArgs>();
    CLI::App* sub = app.add_subcommand("generate", "Generate text with a GGUF model on the GPU");
    sub->add_option("--model,-m", a->model, "GGUF model, or a .bir lowered by `bluec lower`")->required();
    sub->add_option("--prompt,-p", a->prompt, "the prompt (empty: start from BOS)");
    sub->add_option("--prompts", a->prompts_file, "many prompts: one per line, or JSONL with per-prompt parameters");
    sub->add_option("-n,--n-predict", a->n_predict, "tokens to generate at most")->check(CLI::Range(0, 1 << 24));
    sub->add_option("--temp", a->sampling.temperature, "temperature (0: greedy)")->check(CLI::Range(0.0f, 100.0f));
    sub->add_option("--top-k", a->sampling.top_k, "keep the K most likely tokens (0: off)");
    sub->add_option("--top-p", a->sampling.top_p, "keep the most likely tokens up to this mass (1: off)")->check(CLI::Range(0.0f, 1.0f));
    sub->add_option("--min-p", a->sampling.min_p, "drop tokens below this fraction of the top probability")->check(CLI::Range(0.0f, 1.0f));
    sub->add_option("--repeat-penalty", a->sampling.repeat_penalty, "penalty for repeated tokens (1: off)")->check(CLI::Range(0.0f, 100.0f));
    sub->add_option("--repeat-last-n", a->sampling.repeat_last_n, "tokens the penalties look back over");
    sub->add_option("--presence-penalty", a->sampling.presence_penalty, "subtracted once from repeated tokens' logits");
    sub->add_option("--frequency-penalty", a->sampling.frequency_penalty, "subtracted per repetition");
    sub->add_option("--seed", a->sampling.seed, "random seed (same seed, same text)")->each([a](const std::string&) { a->seed_given = true; });
    sub->add_option("--instances", a->instances, "instances sharing the weights")->check(CLI::Range(1u, 4096u));
    sub->add_option("--ctx", a->ctx, "context length per instance (default: the model's, at most 2048)");
    addKvPageOptions(sub, &a->kv_page, &a->kv_pool, "instances x ctx");
    sub->add_option("--chain-cycles", a->chain_cycles, "cycles per recorded chain")->check(CLI::Range(2u, 4096u));
    sub->add_option("--device", a->device, "Vulkan device: index or part of its name");
    addDeviceLimitsOption(sub);
    addVramBudgetOption(sub, &a->vram_budget, &a->host_weights, &a->expert_cache);
    sub->add_option("--out", a->out, "with --prompts: write the JSONL results here");
    sub->add_option("--kv-save", a->kv_save, "after the run, save the conversation's KV cache to this file");
    sub->add_option("--kv-load", a->kv_load,
                    "continue a conversation saved with --kv-save: the prompt is appended to it "
                    "(no BOS); an empty prompt goes on generating");
    sub->add_flag("--ids", a->ids, "print token ids instead of text");
    sub->add_flag("--no-echo", a->no_echo, "do not print the prompt before the generated text");
    sub->add_flag("--stats", a->stats, "print counters and speed as one JSON line on stderr");
    sub->add_flag("--profile", a->profile, "time every kernel (stderr)");
    sub->add_option(
           "--logprobs", a->logprobs,
           "print each generated token's log-probability and its N most likely "
           "alternatives (0..20) on stderr after the text (with --prompts: in each result)")
        ->each([a](const std::string&) { a->logprobs_given = true; });
    sub->add_option("--logprobs-format", a->logprobs_format,
                    "--logprobs as a 'text' table or 'json' lines");
    sub->add_option("--grammar", a->grammar_file,
                    "structured output: the text follows this GBNF grammar file (rule 'root')");
    sub->add_option("--json-schema", a->json_schema_file,
                    "structured output: the text is JSON valid against this JSON schema file");
    sub->add_flag("--json", a->json, "structured output: the text is one JSON object");
    sub->add_option("--grammar-words", a->grammar_words,
                    "words of grammar automaton an instance holds (default: 58368, or what 16 "
                    "instances fit in one device page; 0: no grammar support)");
    return [a] {
        if (!a->seed_given) a->sampling.seed = uint32_t(std::time(nullptr));
        if (a->logprobs_given &&
            (a->logprobs < 0 || a->logprobs > int32_t(BLUE_MAX_TOP_LOGPROBS))) {
            return fail(
                strFormat("--logprobs %d: N is the number of alternatives per token, 0 to %d",
                          a->logprobs, BLUE_MAX_TOP_LOGPROBS));
        }
        if (a->logprobs_format != "text" && a->logprobs_format != "json") {
            return fail("--logprobs-format " + a->logprobs_format + ": 'text' or 'json'");
        }
        if (!a->prompts_file.empty() && (!a->kv_save.empty() || !a->kv_load.empty())) {
            return fail("--kv-save and --kv-load take one --prompt, not --prompts");
        }
        EngineOptions eo;
        eo.device = a->device;
        eo.instances = a->instances;
        eo.ctx = a->ctx;
        eo.chain_cycles = a->chain_cycles;
        eo.profile = a->profile;
        eo.vram_budget = a->vram_budget;
        eo.expert_cache = a->expert_cache;
        eo.host_weights = a->host_weights;
        eo.grammar_words = a->grammar_words;
        eo.kv_page = a->kv_page;
        eo.kv_pool = a->kv_pool;
        ProgressBar bar("loading weights");
        setLoading(&eo, &bar, a.get());
        auto engine = Engine::open(a->model, eo);
        if (!engine) return fail(engine.message());
        if (Status s = compileOutputOption(a.get(), engine.value()->grammarWords()); !s) return fail(s.message());
        int code = a->prompts_file.empty() ? runOne(*engine.value(), *a) : runMany(*engine.value(), *a);
        if (a->profile && code == 0) std::fputs(formatProfile(engine.value()->stats()).c_str(), stderr);
        return code;
    };
}

}  // namespace blue::cli
