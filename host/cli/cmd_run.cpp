// `bluevm run PROGRAM`: runs a Blue-IR program (.bir, or .blue assembled on the fly) on the GPU,
// or on the reference interpreter with --ref, and prints each instance's output.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "compiler/asm.h"
#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/tokenizer.h"
#include "host/cascade/cascade_durable.h"
#include "host/cascade/cascade_run.h"
#include "host/cascade/cascade_trace.h"
#include "host/cli/commands.h"
#include "host/machine.h"
#include "vm/interp.h"
#include "vm/abi.h"
#include "vm/llm_request.h"
#include "vm/output.h"
#include "vm/verify.h"

namespace blue::cli {

namespace {

struct RunArgs {
    std::string program, out, input, device;
    uint32_t instances = 1;
    int32_t siblings = -1;
    uint64_t max_cycles = 1000000;
    uint64_t vram_budget = 0;
    bool expert_cache = true;
    GpuOptions::HostWeights host_weights = GpuOptions::HostWeights::AUTO;
    uint32_t chain_cycles = 64;
    double max_submit_ms = -1;  // negative: GpuOptions' default (BLUE_MAX_SUBMIT_MS or 50)
    bool stats = false, ref = false, profile = false;
    // Generation programs (modules lowered from a model):
    std::string prompt;
    int32_t n_predict = 256;
    float temperature = 0.8f;
    uint32_t seed = 0;
    // Cascades:
    std::vector<std::string> models;  // NAME=PATH
    std::string dump_slots, wal, trace;
};

std::string dirOf(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Input file: one message per non-empty line, words as integers or floats (with a '.').
Result<std::vector<std::vector<uint32_t>>> readInputFile(const std::string& path) {
    std::ifstream in(path);
    if (!in) return BLUE_ERROR("%s: cannot open input file", path.c_str());
    std::vector<std::vector<uint32_t>> messages;
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
        std::istringstream ss(line);
        std::vector<uint32_t> msg;
        std::string tok;
        while (ss >> tok) {
            char* end = nullptr;
            uint32_t word;
            if (tok.find_first_of(".eE") != std::string::npos) {
                float f = std::strtof(tok.c_str(), &end);
                std::memcpy(&word, &f, 4);
            } else {
                word = uint32_t(std::strtoll(tok.c_str(), &end, 0));
            }
            if (!end || *end) return BLUE_ERROR("%s:%d: '%s' is not a number", path.c_str(), number, tok.c_str());
            msg.push_back(word);
        }
        if (!msg.empty()) messages.push_back(std::move(msg));
    }
    return messages;
}

Result<Module> loadProgram(const std::string& path) {
    if (path.size() > 5 && path.compare(path.size() - 5, 5, ".blue") == 0) return assembleFile(path);
    return loadModuleFile(path);
}

// After a run's output: --stats, then its faults and failure (exit code 3 for either).
int reportEnd(const Module& m, const RunReport& report, const RunArgs& args, const std::string& stats_json) {
    std::fflush(stdout);
    if (args.stats) std::fprintf(stderr, "%s\n", stats_json.c_str());
    int code = 0;
    if (std::string faults = describeFaults(m, report.instances); !faults.empty()) {
        std::fprintf(stderr, "bluevm: the program faulted:\n%s", faults.c_str());
        code = 3;
    }
    if (!report.status) {
        std::fprintf(stderr, "bluevm: %s\n", report.status.message().c_str());
        code = 3;
    }
    return code;
}

int finish(const Module& m, const RunReport& report, const std::vector<std::string>& text,
           const RunArgs& args, const std::string& stats_json) {
    std::string listing = formatInstanceOutput(text);
    if (args.out.empty()) {
        std::fwrite(listing.data(), 1, listing.size(), stdout);
    } else {
        std::ofstream f(args.out, std::ios::binary | std::ios::trunc);
        if (!(f << listing)) return fail("cannot write " + args.out);
    }
    return reportEnd(m, report, args, stats_json);
}

std::string referenceStats(const RunReport& report, uint32_t instances) {
    return strFormat("{\"engine\":\"reference\",\"cycles\":%llu,\"steps\":%llu,\"block_runs\":%llu,\"instances\":%u}",
                     (unsigned long long)report.cycles, (unsigned long long)report.steps,
                     (unsigned long long)report.block_runs, instances);
}

int runReference(const Module& m, const WeightSource& w, const RunArgs& args,
                 const std::vector<std::vector<uint32_t>>& inputs) {
    if (Status can = refCanRun(m); !can) return fail(can.message());
    RefMachine machine(m, w, MachineOptions{args.instances, args.max_cycles});
    for (const auto& msg : inputs) machine.pushInput(msg);
    machine.closeInput();
    RunReport report = machine.run();
    std::vector<std::string> text(args.instances);
    appendOutputText(m, report.output, &text);
    return finish(m, report, text, args, referenceStats(report, args.instances));
}

// A generation program (lowered by `bluec lower`) on the reference interpreter: --prompt becomes
// one request, tokenized with the model the module names, and the text is printed as `run` on
// the GPU prints it (the prompt, then what was generated).
int runGenerationReference(const Module& m, const RunArgs& args) {
    const std::string dir = dirOf(args.program);
    auto ctx = checkGenerationModule(m, args.program);
    if (!ctx) return fail(ctx.message());
    auto gguf = ggufOpen(resolveModulePath(dir, m.externs[0]));
    if (!gguf) return fail(gguf.message());
    auto tok = Tokenizer::fromGguf(gguf.value());
    if (!tok) return fail(tok.message());
    auto weights = WeightSource::open(m, dir);
    if (!weights) return fail(weights.message());
    GenerationRequest r;
    r.prompt = tok->promptIds(args.prompt);
    if (r.prompt.size() >= ctx.value()) {
        return fail(strFormat("the prompt is %zu tokens; the program's context is %u", r.prompt.size(), ctx.value()));
    }
    r.max_new = uint32_t(args.n_predict);
    r.sampling.temperature = args.temperature;
    r.sampling.seed = args.seed;
    if (Status can = refCanRun(m); !can) return fail(can.message());
    RefMachine machine(m, weights.value(), MachineOptions{1, args.max_cycles});
    machine.pushInput(encodeRequest(r));
    machine.closeInput();
    RunReport report = machine.run();
    TokenStreamDecoder decoder(tok.value(), false, args.prompt.empty());
    std::string text = args.prompt;
    for (const OutputRecord& rec : report.output) {
        if (rec.kind == BLUE_OUT_TOKEN) text += decoder.push(int32_t(rec.value));
    }
    text += decoder.finish();
    std::printf("%s\n", text.c_str());
    return reportEnd(m, report, args, referenceStats(report, 1));
}

int runGpu(const Module& m, const WeightSource& w, const RunArgs& args,
           const std::vector<std::vector<uint32_t>>& inputs) {
    auto dev = Device::create(DeviceOptions{args.device, false});
    if (!dev) return fail(dev.message());
    auto pipelines = Pipelines::create(*dev.value());
    if (!pipelines) return fail(pipelines.message());
    GpuOptions opt;
    opt.instances = args.instances;
    opt.max_cycles = args.max_cycles;
    opt.chain_cycles = args.chain_cycles;
    opt.profile = args.profile;
    opt.max_submit_ms = args.max_submit_ms;
    opt.vram_budget = args.vram_budget;
    opt.expert_cache = args.expert_cache;
    opt.host_weights = args.host_weights;
    auto machine = GpuMachine::create(*dev.value(), *pipelines.value(), m, w, opt);
    if (!machine) return fail(machine.message());
    for (const auto& msg : inputs) {
        if (Status s = machine.value()->pushInput(msg); !s) return fail(s.message());
    }
    machine.value()->closeInput();
    std::vector<std::string> text(args.instances);
    auto report = machine.value()->run(
        [&](std::span<const OutputRecord> recs) { appendOutputText(m, recs, &text); }, false);
    if (!report) return fail(report.message());
    if (args.profile) std::fputs(formatProfile(machine.value()->stats()).c_str(), stderr);
    return finish(m, report.value(), text, args, machine.value()->stats().json());
}

std::string readTextFile(const std::string& path, bool* ok) {
    std::ifstream in(path, std::ios::binary);
    *ok = bool(in);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// `bluevm run CASCADE.bir`: the task comes from --input (a text file) or --prompt.
int runCascade(const RunArgs& args) {
    CascadeRunOptions opt;
    opt.device = args.device;
    opt.reference = args.ref;
    opt.instances = args.instances;
    opt.siblings = args.siblings;
    opt.chain_cycles = args.chain_cycles;
    opt.max_submit_ms = args.max_submit_ms;
    opt.profile = args.profile;
    for (const std::string& mp : args.models) {
        if (Status s = parseModelOverride(mp, &opt.models); !s) return fail(s.message());
    }
    std::string task = args.prompt;
    if (!args.input.empty()) {
        bool ok = false;
        task = readTextFile(args.input, &ok);
        if (!ok) return fail(args.input + ": cannot open the task file");
        while (!task.empty() && (task.back() == '\n' || task.back() == '\r')) task.pop_back();
    }
    if (!args.wal.empty() && args.instances != 1) return fail("--wal logs one task; run it without --instances");
    auto runner = CascadeRunner::open(args.program, opt);
    if (!runner) return fail(runner.message());
    const CascadeInfo& info = runner.value()->info();
    std::vector<CascadeTask> tasks;
    for (uint32_t i = 0; i < args.instances; ++i) tasks.push_back({task, args.seed + i});
    Result<std::vector<CascadeResult>> results = Status::error("not run");
    bool from_log = false;
    if (!args.wal.empty()) {
        auto durable = runDurable(*runner.value(), tasks[0], args.ref, args.wal,
                                  [](const std::string& line) { std::fprintf(stderr, "bluevm: %s\n", line.c_str()); });
        if (!durable) return fail(durable.message());
        from_log = durable->from_log;
        results = std::vector<CascadeResult>{std::move(durable->result)};
    } else {
        results = runner.value()->run(tasks);
    }
    if (!results) return fail(results.message());
    if (args.profile && !args.ref) std::fputs(formatProfile(runner.value()->gpuStats()).c_str(), stderr);
    for (size_t i = 0; i < results->size(); ++i) {
        const CascadeResult& r = (*results)[i];
        if (!r.complete) return fail(strFormat("task %zu did not complete", i));
        if (tasks.size() > 1) std::printf("[%zu] seed %u\n", i, tasks[i].seed);
        for (uint32_t o : info.outputs) {
            if (info.outputs.size() > 1) std::printf("--- %s ---\n", info.slots[o].c_str());
            std::printf("%s\n", r.slot_text[o].c_str());
        }
        if (!args.dump_slots.empty()) {
            std::string dir = args.dump_slots + (tasks.size() > 1 ? "/" + std::to_string(i) : "");
            std::error_code ec;
            std::filesystem::create_directories(dir, ec);
            if (ec) return fail("--dump-slots: cannot create " + dir + ": " + ec.message());
            for (size_t k = 0; k < info.slots.size(); ++k) {
                std::ofstream f(dir + "/" + info.slots[k] + ".txt", std::ios::binary | std::ios::trunc);
                if (!(f << r.slot_text[k])) return fail("--dump-slots: cannot write " + dir + "/" + info.slots[k] + ".txt");
            }
        }
        if (args.stats) {
            std::string json = cascadeStatsJson(r);
            json.pop_back();
            std::fprintf(stderr, "%s,\"machine\":%s}\n", json.c_str(), from_log ? "null" : runner.value()->statsJson().c_str());
        }
        if (!args.trace.empty()) {
            if (Status s = appendTraceLine(args.trace, cascadeTraceLine(info, tasks[i], r)); !s) return fail(s.message());
        }
    }
    std::fflush(stdout);
    return 0;
}

}  // namespace

Command addRunCommand(CLI::App& app) {
    auto args = std::make_shared<RunArgs>();
    CLI::App* sub = app.add_subcommand("run", "Run a Blue-IR program (.bir or .blue)");
    sub->add_option("program", args->program, "the program")->required();
    sub->add_option("--instances,-n", args->instances, "instances to run")->check(CLI::Range(1u, 1u << 24));
    sub->add_option("--device", args->device, "Vulkan device: index or part of its name");
    addDeviceLimitsOption(sub);
    addVramBudgetOption(sub, &args->vram_budget, &args->host_weights, &args->expert_cache);
    sub->add_option("--max-cycles", args->max_cycles, "stop a program that runs longer (watchdog)")->check(CLI::PositiveNumber);
    sub->add_option("--chain-cycles", args->chain_cycles, "cycles recorded per chain")->check(CLI::Range(2u, 4096u));
    sub->add_option("--max-submit-ms", args->max_submit_ms,
                    "keep each submission's GPU time under this (chains shorten; 0: off; "
                    "default: BLUE_MAX_SUBMIT_MS or 50)")
        ->check(CLI::Range(0.0, 1e6));
    sub->add_option("--out", args->out, "write the output to FILE instead of stdout");
    sub->add_option("--input", args->input, "input messages: one per line, numbers (cascades: the task, a text file)");
    sub->add_flag("--stats", args->stats, "print execution counters as one JSON line on stderr");
    sub->add_flag("--ref", args->ref, "run on the CPU reference interpreter instead of the GPU");
    sub->add_flag("--profile", args->profile, "time every kernel with GPU timestamps (stderr)");
    sub->add_option("--prompt", args->prompt, "generation programs: the prompt (empty: from BOS)");
    sub->add_option("--n-predict", args->n_predict, "generation programs: tokens to generate at most");
    sub->add_option("--temp", args->temperature, "generation programs: temperature (0: greedy)");
    sub->add_option("--seed", args->seed, "generation programs and cascades: random seed");
    sub->add_option("--model", args->models, "cascades: NAME=PATH replaces a model's file (same tensors); repeatable");
    sub->add_option("--dump-slots", args->dump_slots, "cascades: write every slot's text to DIR/SLOT.txt");
    sub->add_option("--wal", args->wal,
                    "cascades: durable slots: log every stage's checkpoint to FILE (fsynced); with an existing "
                    "FILE, resume after its last completed stage");
    sub->add_option("--siblings", args->siblings,
                    "cascades with `fork K`: instances beside the tasks that run fork branches "
                    "(default: K - 1 per task; 0: each task runs its branches one after another)")
        ->check(CLI::Range(0, 4096));
    sub->add_option("--trace", args->trace, "cascades: append one JSON line per task (stages, slots, preference pair) to FILE");
    return [args] {
        auto m = loadProgram(args->program);
        if (!m) return fail(m.message());
        const std::string* kind = m->metaValue("blue.kind");
        if (args->vram_budget && kind && (*kind == "cascade" || (*kind == "llm-generate" && !args->ref))) {
            return fail("--vram-budget applies to `run` of plain programs; give it to `bluevm generate` "
                        "or `bluevm serve` for models");
        }
        if (kind && *kind == "cascade") return runCascade(*args);
        if (kind && *kind == "llm-generate" && !args->ref) {
            return runGenerationModule(args->program, args->prompt, args->n_predict, args->temperature,
                                       args->seed, args->instances, args->stats, args->device);
        }
        if (kind && *kind == "llm-generate" && args->input.empty()) return runGenerationReference(m.value(), *args);
        auto weights = WeightSource::open(m.value(), dirOf(args->program));
        if (!weights) return fail(weights.message());
        std::vector<std::vector<uint32_t>> inputs;
        if (!args->input.empty()) {
            auto in = readInputFile(args->input);
            if (!in) return fail(in.message());
            inputs = std::move(in.value());
        }
        if (m->layout.in_slots == 0 && !inputs.empty()) {
            return fail("--input given, but this program reads no input (in_slots=0)");
        }
        return args->ref ? runReference(m.value(), weights.value(), *args, inputs)
                         : runGpu(m.value(), weights.value(), *args, inputs);
    };
}

}  // namespace blue::cli
