// Cascade lowering: checks a parsed cascade against its models and emits one module with a
// forward block per model and control code that runs the whole cascade per request on the GPU
// (vm/cascade_abi.h): prompt assembly from literals and slots, sampling parameters, prefill and
// decode with stop and budget rules, statistics, skips, conditions and bounded loops.
#include <bit>
#include <filesystem>
#include <functional>
#include <map>

#include "compiler/cascade/cascade.h"
#include "compiler/cascade/lowerer.h"
#include "compiler/code_builder.h"
#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "compiler/tokenizer.h"
#include "vm/abi.h"
#include "vm/cascade_abi.h"
#include "vm/llm_abi.h"
#include "vm/mapped_file.h"
#include "vm/weights.h"
#include "vm/verify.h"

namespace blue {

namespace cascade {


// ---- models ----------------------------------------------------------------------------------

static std::string recordedPath(const std::string& path, const std::string& module_dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path a = fs::absolute(path, ec);
    fs::path rel = fs::relative(a, fs::absolute(module_dir, ec), ec);
    return ec || rel.empty() ? a.string() : rel.string();
}

Status Lowerer::openModels() {
    if (p.models.empty()) return errorAt({1, 1}, "the cascade declares no model (add `model NAME = \"PATH.gguf\"`)");
    for (const auto& [name, path] : opt.models) {
        bool found = false;
        for (const ModelDecl& d : p.models) found |= d.name == name;
        if (!found) return BLUE_ERROR("%s: --model %s: the cascade declares no model '%s'", p.file.c_str(), name.c_str(), name.c_str());
    }
    std::string src_dir = std::filesystem::path(p.file).parent_path().string();
    for (const ModelDecl& d : p.models) {
        LoadedModel lm;
        lm.name = d.name;
        auto over = opt.models.find(d.name);
        std::string path = over != opt.models.end() ? over->second : resolveModulePath(src_dir, d.path);
        std::string where = over != opt.models.end() ? "--model " + d.name : "";
        auto fail = [&](const std::string& msg) {
            return over != opt.models.end() ? BLUE_ERROR("%s: %s", where.c_str(), msg.c_str())
                                            : errorAt(d.path_loc, "model '" + d.name + "': " + msg);
        };
        auto g = ggufOpen(path);
        if (!g) return fail(g.message());
        lm.gguf = std::move(g.value());
        auto cfg = modelConfigFromGguf(lm.gguf);
        if (!cfg) return fail(cfg.message());
        lm.cfg = cfg.value();
        if (Status s = checkLowerable(lm.cfg); !s) return fail(path + ": " + s.message());
        auto tok = Tokenizer::fromGguf(lm.gguf);
        if (!tok) return fail(tok.message());
        lm.tok = std::move(tok.value());
        lm.path = recordedPath(path, opt.module_dir);
        uint32_t trained = lm.cfg.n_ctx_train ? lm.cfg.n_ctx_train : 2048;
        lm.ctx = p.context ? p.context : std::min<uint32_t>(trained, 2048);
        if (p.context && p.context > trained) {
            return errorAt(d.loc, strFormat("context %u is more than model '%s' was trained for (%u)", p.context, d.name.c_str(), trained));
        }
        if (lm.tok.addBos() && lm.tok.bos() >= 0) lm.bos = uint32_t(lm.tok.bos());
        lm.eog = endOfGenerationTokens(lm.gguf, lm.cfg);
        if (!models.empty() && vocabFingerprint(lm.tok) != vocabFingerprint(models[0].tok)) {
            return errorAt(d.loc, strFormat(
                "model '%s' has another vocabulary than model '%s' (%d and %d tokens, or different token texts); "
                "stages pass tokens to each other, and re-tokenizing between vocabularies is not supported",
                d.name.c_str(), models[0].name.c_str(), lm.tok.vocabSize(), models[0].tok.vocabSize()));
        }
        models.push_back(std::move(lm));
    }
    return Status::ok();
}

// ---- checks ----------------------------------------------------------------------------------

static bool before(Loc a, Loc b) { return a.line < b.line || (a.line == b.line && a.col < b.col); }

Status Lowerer::checkCond(const Cond& c, Loc at) const {
    switch (c.kind) {
        case Cond::AND:
        case Cond::OR:
            BLUE_TRY(checkCond(*c.a, at));
            return checkCond(*c.b, at);
        case Cond::NOT: return checkCond(*c.a, at);
        case Cond::CONTAINS:
            if (slotIndex(c.subject) < 0) return errorAt(c.loc, "'contains' needs a slot; '" + c.subject + "' is not one");
            if (tokensOf(c.text, true).empty()) return errorAt(c.text_loc, "the text has no tokens");
            return Status::ok();
        case Cond::CMP: break;
    }
    if (slotIndex(c.subject) >= 0) {
        if (c.metric != "length") return errorAt(c.metric_loc, "a slot has one statistic, 'length'; found '" + c.metric + "'");
        return Status::ok();
    }
    if (int k = kernelIndex(p, c.subject); k >= 0) return checkKernelCond(p, uint32_t(k), c, at);
    int s = stageIndex(c.subject);
    if (s < 0) return errorAt(c.loc, "no stage or slot named '" + c.subject + "'");
    if (!before(p.stages[s].loc, at)) return errorAt(c.loc, "stage '" + c.subject + "' is written after this condition (line " + std::to_string(p.stages[s].loc.line) + ")");
    static const char* metrics[] = {"tokens", "entropy_mean", "entropy_max", "logprob_mean", "runs", "choice"};
    for (const char* name : metrics) {
        if (c.metric == name) return Status::ok();
    }
    return errorAt(c.metric_loc, "unknown statistic '" + c.metric + "' (tokens, entropy_mean, entropy_max, logprob_mean, runs, choice)");
}

Status Lowerer::checkStmts(const std::vector<Stmt>& body) {
    for (const Stmt& s : body) {
        if (s.cond) BLUE_TRY(checkCond(*s.cond, s.loc));
        BLUE_TRY(checkStmts(s.body));
        BLUE_TRY(checkStmts(s.else_body));
    }
    return Status::ok();
}

Status Lowerer::checkNames() {
    stage_model.resize(p.stages.size());
    stage_draft.assign(p.stages.size(), 0);
    stage_judge.assign(p.stages.size(), 0);
    for (size_t i = 0; i < p.stages.size(); ++i) {
        const Stage& st = p.stages[i];
        if (st.model.empty()) {
            if (models.size() != 1) return errorAt(st.loc, "stage '" + st.name + "' names no model, and the cascade has several");
            stage_model[i] = 0;
        } else {
            bool found = false;
            for (size_t k = 0; k < models.size(); ++k) {
                if (models[k].name == st.model) { stage_model[i] = uint32_t(k); found = true; }
            }
            if (!found) return errorAt(st.model_loc, "no model named '" + st.model + "'");
        }
        models[stage_model[i]].used = true;
        models[stage_model[i]].as_plain |= st.speculate.empty() && st.options.empty();
        models[stage_model[i]].as_score |= !st.options.empty();
        if (!st.options.empty()) {
            if (!st.speculate.empty()) return errorAt(st.select_loc, "a stage cannot both select and speculate");
            if (!st.stops.empty()) return errorAt(st.stop_locs[0], "a select stage writes a whole option: stop strings do not apply");
            for (size_t k = 0; k < st.options.size(); ++k) {
                if (tokensOf(st.options[k], true).empty()) return errorAt(st.option_locs[k], "the option has no tokens");
            }
        }
        if (!st.speculate.empty()) {
            bool found = false;
            for (size_t k = 0; k < models.size(); ++k) {
                if (models[k].name == st.speculate) { stage_draft[i] = uint32_t(k); found = true; }
            }
            if (!found) return errorAt(st.speculate_loc, "no model named '" + st.speculate + "'");
            if (st.repeat_penalty != 1.0f) {
                return errorAt(st.speculate_loc, "repeat_penalty cannot be combined with speculate (the target scores all drafted positions at once)");
            }
            models[stage_draft[i]].used = models[stage_draft[i]].as_draft = true;
            models[stage_model[i]].as_target = true;
        }
        if (st.fork > 1) {
            if (!st.options.empty()) return errorAt(st.fork_loc, "a select stage cannot fork (it scores its options once)");
            if (!st.speculate.empty()) return errorAt(st.fork_loc, "a stage cannot both fork and speculate");
        }
        if (!st.judge.empty()) {
            bool found = false;
            for (size_t k = 0; k < models.size(); ++k) {
                if (models[k].name == st.judge) { stage_judge[i] = uint32_t(k); found = true; }
            }
            if (!found) return errorAt(st.judge_loc, "no model named '" + st.judge + "'");
            models[stage_judge[i]].used = models[stage_judge[i]].as_score = true;
        }
        for (const PromptPart& part : st.prompt) {
            if (!part.literal && slotIndex(part.text) < 0) return errorAt(part.loc, "no slot named '" + part.text + "'");
        }
        int target = slotIndex(st.target);
        if (target < 0) return errorAt(st.target_loc, "no slot named '" + st.target + "'");
        if (target == 0) return errorAt(st.target_loc, "the input slot is read-only");
        for (size_t k = 0; k < st.stops.size(); ++k) {
            if (tokensOf(st.stops[k], true).empty()) return errorAt(st.stop_locs[k], "the stop string has no tokens");
        }
        if (st.skip_if) BLUE_TRY(checkCond(*st.skip_if, st.loc));
    }
    for (size_t k = 0; k < models.size(); ++k) {
        if (!models[k].used) return errorAt(p.models[k].loc, "model '" + models[k].name + "' is declared but no stage uses it");
    }
    for (size_t k = 0; k < p.outputs.size(); ++k) {
        int s = slotIndex(p.outputs[k]);
        if (s < 0) return errorAt(p.output_locs[k], "no slot named '" + p.outputs[k] + "'");
        if (s == 0) return errorAt(p.output_locs[k], "'input' is the task itself; output a slot the stages write");
    }
    if (p.stages.empty()) return errorAt({1, 1}, "the cascade has no stage");
    BLUE_TRY(checkPrefer());
    BLUE_TRY(checkKernelUses(p, [this](const std::string& n) { return slotIndex(n); }));
    return checkStmts(p.body);
}

// `prefer CHOSEN over REJECTED`: two different slots the stages write.
Status Lowerer::checkPrefer() const {
    if (!p.prefer_loc.line) return Status::ok();
    for (auto [name, loc] : {std::pair{&p.prefer_chosen, p.prefer_chosen_loc}, {&p.prefer_rejected, p.prefer_rejected_loc}}) {
        int s = slotIndex(*name);
        if (s < 0) return errorAt(loc, "prefer: no slot named '" + *name + "'");
        if (s == 0) return errorAt(loc, "prefer: 'input' is the task (the pair's prompt); name slots the stages write");
    }
    if (p.prefer_chosen == p.prefer_rejected) return errorAt(p.prefer_rejected_loc, "prefer: a slot cannot be preferred over itself");
    return Status::ok();
}

// Every stage's prompt and generation must fit its model's context whatever the slots hold:
// checked here, so the program never has to truncate.
Status Lowerer::checkSizes() {
    for (size_t i = 0; i < p.stages.size(); ++i) {
        const Stage& st = p.stages[i];
        const LoadedModel& lm = models[stage_model[i]];
        uint64_t worst = lm.bos != kNoToken ? 1 : 0;
        bool first = true;
        for (const PromptPart& part : st.prompt) {
            worst += part.literal ? tokensOf(part.text, !first).size() : slot_cap[size_t(slotIndex(part.text))];
            first = false;
        }
        uint32_t cap = slot_cap[size_t(slotIndex(st.target))];
        if (!st.options.empty()) {
            size_t longest = 0;
            for (const std::string& o : st.options) longest = std::max(longest, tokensOf(o, true).size());
            if (longest > cap) {
                return errorAt(st.select_loc, strFormat("stage '%s': an option has %zu tokens, more than slot '%s' holds (%u)",
                                                        st.name.c_str(), longest, st.target.c_str(), cap));
            }
            if (worst + longest > lm.ctx) {
                return errorAt(st.prompt_loc, strFormat("stage '%s': its prompt (full slots) and an option can reach %llu tokens, "
                                                        "more than the context of model '%s' (%u)",
                                                        st.name.c_str(), (unsigned long long)(worst + longest), lm.name.c_str(), lm.ctx));
            }
            if (longest + 1 > opt.max_rows) return errorAt(st.select_loc, "an option is longer than the rows one step takes");
            continue;
        }
        if (st.max_tokens > cap) {
            return errorAt(st.loc, strFormat("stage '%s': max_tokens %u is more than slot '%s' holds (%u)",
                                             st.name.c_str(), st.max_tokens, st.target.c_str(), cap));
        }
        uint32_t ctx = lm.ctx;
        if (!st.speculate.empty()) {
            ctx = std::min(ctx, models[stage_draft[i]].ctx);
            worst += BLUE_SPEC_MAX_DRAFT;  // a verification may score drafts past the last token
        }
        if (!st.judge.empty()) {
            const LoadedModel& judge = models[stage_judge[i]];
            if (worst + st.max_tokens > judge.ctx) {
                return errorAt(st.judge_loc, strFormat("stage '%s': its prompt (full slots) and a branch can reach %llu tokens, "
                                                       "more than the context of the judge '%s' (%u)",
                                                       st.name.c_str(), (unsigned long long)(worst + st.max_tokens),
                                                       judge.name.c_str(), judge.ctx));
            }
            if (st.max_tokens + 1 > opt.max_rows) {
                return errorAt(st.judge_loc, strFormat("stage '%s': the judge scores a branch in one step of up to %u rows; "
                                                       "max_tokens %u is too many (raise --max-rows)",
                                                       st.name.c_str(), opt.max_rows, st.max_tokens));
            }
        }
        if (worst + st.max_tokens > ctx) {
            return errorAt(st.prompt_loc, strFormat(
                "stage '%s': its prompt can reach %llu tokens (full slots) and it may add %u, more than the "
                "context of model '%s' (%u)%s; shrink the slots or max_tokens, or raise `context`",
                st.name.c_str(), (unsigned long long)worst, st.max_tokens, lm.name.c_str(), ctx,
                st.speculate.empty() ? "" : ", with room for a speculation"));
        }
    }
    return Status::ok();
}

// ---- code ------------------------------------------------------------------------------------

void Lowerer::layout() {
    uint32_t addr = stats_base + uint32_t(p.stages.size()) * BLUE_CAS_STAGE_WORDS;
    bool speculates = false;
    for (const Stage& st : p.stages) speculates |= !st.speculate.empty();
    if (speculates) {
        spec_base = addr;
        addr += BLUE_SPEC_WORDS;
    }
    slots_base = addr;
    slot_cap.push_back(p.input_capacity);
    for (const SlotDecl& s : p.slots) slot_cap.push_back(s.capacity);
    for (uint32_t cap : slot_cap) {
        slot_addr.push_back(addr);
        addr += 1 + cap;
    }
    hist_base = addr;
    for (const LoadedModel& lm : models) max_ctx = std::max(max_ctx, lm.ctx);
    for (const Stage& st : p.stages) {
        if (st.fork < 2) continue;
        max_fork = std::max(max_fork, st.fork);
        branch_cap = std::max(branch_cap, st.max_tokens);
    }
    branch_slot = hist_base + max_ctx;
}

void Lowerer::emitCond(const Cond& c, CodeBuilder::Label yes, CodeBuilder::Label no) {
    switch (c.kind) {
        case Cond::AND: {
            auto mid = cb.newLabel();
            emitCond(*c.a, mid, no);
            cb.bind(mid);
            emitCond(*c.b, yes, no);
            return;
        }
        case Cond::OR: {
            auto mid = cb.newLabel();
            emitCond(*c.a, yes, mid);
            cb.bind(mid);
            emitCond(*c.b, yes, no);
            return;
        }
        case Cond::NOT: emitCond(*c.a, no, yes); return;
        case Cond::CONTAINS: {
            // Is the text's token sequence a contiguous run of the slot's tokens?
            std::vector<uint32_t> seq = tokensOf(c.text, true);
            uint32_t at = addConsts(seq), base = slot_addr[size_t(slotIndex(c.subject))];
            auto outer = cb.newLabel(), inner = cb.newLabel(), next = cb.newLabel();
            cb.op(Op::LD, {kLen, kZero}, base);
            cb.li(kN, uint32_t(seq.size()));
            cb.li(kI, 0);
            cb.bind(outer);
            cb.op(Op::ADD, {kTmp, kI, kN});
            cb.jump(Op::BLTU, {kLen, kTmp}, no);
            cb.li(kJ, 0);
            cb.bind(inner);
            cb.jump(Op::BGEU, {kJ, kN}, yes);
            cb.op(Op::ADD, {kTmp, kI, kJ});
            cb.op(Op::LD, {kWord, kTmp}, base + 1);
            cb.op(Op::LDK, {kWord2, kJ}, at);
            cb.jump(Op::BNE, {kWord, kWord2}, next);
            cb.op(Op::ADDI, {kJ, kJ}, 1);
            cb.jump(Op::JMP, {}, inner);
            cb.bind(next);
            cb.op(Op::ADDI, {kI, kI}, 1);
            cb.jump(Op::JMP, {}, outer);
            return;
        }
        case Cond::CMP: break;
    }
    // The subject's value as a float in kF1.
    int slot = slotIndex(c.subject);
    if (int k = kernelIndex(p, c.subject); k >= 0) {  // a custom kernel's result word (a float)
        cb.li(kTmp, kernelMetricWord(c.metric));
        cb.op(Op::TLD, {kF1, kTmp}, kernels_.kernels[size_t(k)].result_tensor);
    } else if (slot >= 0) {
        cb.op(Op::LD, {kTmp, kZero}, slot_addr[size_t(slot)]);
        cb.op(Op::UTOF, {kF1, kTmp});
    } else {
        uint32_t st = stats_base + uint32_t(stageIndex(c.subject)) * BLUE_CAS_STAGE_WORDS;
        if (c.metric == "tokens" || c.metric == "runs" || c.metric == "choice") {
            uint32_t word = c.metric == "tokens" ? BLUE_CAS_ST_TOKENS : c.metric == "runs" ? BLUE_CAS_ST_RUNS : BLUE_CAS_ST_CHOICE;
            cb.op(Op::LD, {kTmp, kZero}, st + word);
            cb.op(Op::UTOF, {kF1, kTmp});
        } else if (c.metric == "entropy_max") {
            cb.op(Op::LD, {kF1, kZero}, st + BLUE_CAS_ST_ENT_MAX);
        } else {  // a mean over the tokens; 0 when there are none
            auto done = cb.newLabel();
            cb.op(Op::LD, {kTmp, kZero}, st + BLUE_CAS_ST_TOKENS);
            cb.op(Op::LF, {kF1}, floatBits(0.0f));
            cb.jump(Op::BEQZ, {kTmp}, done);
            cb.op(Op::LD, {kF1, kZero}, st + (c.metric == "entropy_mean" ? BLUE_CAS_ST_ENT_SUM : BLUE_CAS_ST_LP_SUM));
            cb.op(Op::UTOF, {kF2, kTmp});
            cb.op(Op::FDIV, {kF1, kF1, kF2});
            cb.bind(done);
        }
    }
    cb.op(Op::LF, {kF2}, floatBits(float(c.number)));
    bool negate = c.op == "!=";
    if (c.op == "<") cb.op(Op::FLT, {kTmp, kF1, kF2});
    else if (c.op == "<=") cb.op(Op::FLE, {kTmp, kF1, kF2});
    else if (c.op == ">") cb.op(Op::FLT, {kTmp, kF2, kF1});
    else if (c.op == ">=") cb.op(Op::FLE, {kTmp, kF2, kF1});
    else cb.op(Op::FEQ, {kTmp, kF1, kF2});
    cb.jump(negate ? Op::BEQZ : Op::BNEZ, {kTmp}, yes);
    cb.jump(Op::JMP, {}, no);
}

// Appends the tokens of the slot at `slot` to the history at kPos.
void Lowerer::emitCopy(uint32_t slot) {
    auto loop = cb.newLabel(), done = cb.newLabel();
    cb.op(Op::LD, {kN, kZero}, slot);
    cb.li(kI, 0);
    cb.bind(loop);
    cb.jump(Op::BGEU, {kI, kN}, done);
    cb.op(Op::LD, {kWord, kI}, slot + 1);
    cb.op(Op::ST, {kWord, kPos}, hist_base);
    cb.op(Op::ADDI, {kPos, kPos}, 1);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, loop);
    cb.bind(done);
}

void Lowerer::emitStage(uint32_t s) {
    const Stage& st = p.stages[s];
    const LoadedModel& lm = models[stage_model[s]];
    const uint32_t stats = stats_base + s * BLUE_CAS_STAGE_WORDS;
    const uint32_t target = slot_addr[size_t(slotIndex(st.target))];
    const uint32_t target_cap = slot_cap[size_t(slotIndex(st.target))];
    auto end = cb.newLabel(), run = cb.newLabel(), done = cb.newLabel();

    if (st.skip_if) {
        auto skip = cb.newLabel();
        emitCond(*st.skip_if, skip, run);
        cb.bind(skip);
        cb.li(kTmp, BLUE_CAS_STATE_SKIPPED);
        cb.op(Op::ST, {kTmp, kZero}, stats + BLUE_CAS_ST_STATE);
        cb.jump(Op::JMP, {}, end);
    }
    cb.bind(run);
    if (p.budget) {
        auto ok = cb.newLabel();
        cb.li(kTmp, p.budget);
        cb.jump(Op::BLTU, {kTotal, kTmp}, ok);
        cb.li(kTmp, BLUE_CAS_STATE_NO_BUDGET);
        cb.op(Op::ST, {kTmp, kZero}, stats + BLUE_CAS_ST_STATE);
        cb.jump(Op::JMP, {}, end);
        cb.bind(ok);
    }
    emitPrompt(s);
    if (st.fork > 1) {
        emitFork(s, done);
    } else {
        // The target is cleared only now: a stage may rewrite the slot it reads.
        if (!st.append) cb.op(Op::ST, {kZero, kZero}, target);
        emitRunStart(s);
        // Each stage run draws from its own stream of the request's seed.
        emitSampling(s);
        cb.op(Op::MULI, {kTmp, kRuns}, 0x9E3779B9u);
        cb.op(Op::ADD, {kTmp, kTmp, kSeed});
        cb.op(Op::ST, {kTmp, kZero}, BLUE_LM_SAMPLING + BLUE_SP_SEED);
        cb.op(Op::ADDI, {kRuns, kRuns}, 1);
        cb.jump(Op::BEQZ, {kPrompt}, done);
        if (!st.options.empty()) {
            auto chosen = cb.newLabel();
            emitSelect(s, chosen);
            cb.bind(chosen);
            cb.op(Op::ST, {kE, kZero}, stats + BLUE_CAS_ST_CHOICE);
            cb.op(Op::ST, {kF2, kZero}, stats + BLUE_CAS_ST_LP_SUM);
        } else if (!st.speculate.empty()) {
            // The draft reads the prompt too (no table row: its draws are discarded); the target's
            // verify block in prefill mode draws the first token.
            cb.li(kTmp, 0xFFFFFFFFu);
            cb.op(Op::ST, {kTmp, kZero}, BLUE_LM_SAMPLING + BLUE_SP_ROW);
            emitPrefill(models[stage_draft[s]].draft_block);
            cb.li(kTmp, 1);
            cb.op(Op::ST, {kTmp, kZero}, spec_base + BLUE_SPEC_MODE);
            cb.li(kArgSpec, spec_base);
            emitPrefill(lm.verify_block);
            cb.op(Op::ST, {kZero, kZero}, spec_base + BLUE_SPEC_MODE);
        } else {
            emitPrefill(lm.block);
        }
        if (st.options.empty()) emitGenerate(s, GenInto{target, target_cap, false}, done);
    }
    cb.bind(done);
    cb.op(Op::CYCLE, {kTmp});
    cb.op(Op::LD, {kTmp2, kZero}, stats + BLUE_CAS_ST_CYCLES);
    cb.op(Op::SUB, {kTmp, kTmp, kTmp2});
    cb.op(Op::ST, {kTmp, kZero}, stats + BLUE_CAS_ST_CYCLES);
    emitStageEnd(s);
    cb.bind(end);
}

// The prompt into history[0, kPrompt): BOS, then literals and slots in order.
void Lowerer::emitPrompt(uint32_t s) {
    const Stage& st = p.stages[s];
    const LoadedModel& lm = models[stage_model[s]];
    cb.li(kPos, 0);
    if (lm.bos != kNoToken) {
        cb.li(kTmp, lm.bos);
        cb.op(Op::ST, {kTmp, kZero}, hist_base);
        cb.li(kPos, 1);
    }
    bool first = true;
    for (const PromptPart& part : st.prompt) {
        if (part.literal) {
            std::vector<uint32_t> toks = tokensOf(part.text, !first);
            if (!toks.empty()) {
                uint32_t at = addConsts(toks);
                auto loop = cb.newLabel(), copied = cb.newLabel();
                cb.li(kI, 0);
                cb.li(kN, uint32_t(toks.size()));
                cb.bind(loop);
                cb.jump(Op::BGEU, {kI, kN}, copied);
                cb.op(Op::LDK, {kWord, kI}, at);
                cb.op(Op::ST, {kWord, kPos}, hist_base);
                cb.op(Op::ADDI, {kPos, kPos}, 1);
                cb.op(Op::ADDI, {kI, kI}, 1);
                cb.jump(Op::JMP, {}, loop);
                cb.bind(copied);
            }
        } else {
            emitCopy(slot_addr[size_t(slotIndex(part.text))]);
        }
        first = false;
    }
    cb.op(Op::MOV, {kPrompt, kPos});
}

// A run of stage `s` begins: its statistics are cleared, its state, runs and start cycle set.
void Lowerer::emitRunStart(uint32_t s) {
    const uint32_t stats = stats_base + s * BLUE_CAS_STAGE_WORDS;
    for (uint32_t w : {BLUE_CAS_ST_TOKENS, BLUE_CAS_ST_ENT_SUM, BLUE_CAS_ST_ENT_MAX, BLUE_CAS_ST_LP_SUM,
                       BLUE_CAS_ST_DRAFTED, BLUE_CAS_ST_ACCEPTED, BLUE_CAS_ST_PASSES, BLUE_CAS_ST_BRANCHES,
                       BLUE_CAS_ST_SIBLINGS, BLUE_CAS_ST_BRANCH_TOKENS}) {
        cb.op(Op::ST, {kZero, kZero}, stats + w);
    }
    cb.li(kTmp, BLUE_CAS_STATE_RAN);
    cb.op(Op::ST, {kTmp, kZero}, stats + BLUE_CAS_ST_STATE);
    cb.op(Op::LD, {kTmp, kZero}, stats + BLUE_CAS_ST_RUNS);
    cb.op(Op::ADDI, {kTmp, kTmp}, 1);
    cb.op(Op::ST, {kTmp, kZero}, stats + BLUE_CAS_ST_RUNS);
    cb.op(Op::CYCLE, {kTmp});
    cb.op(Op::ST, {kTmp, kZero}, stats + BLUE_CAS_ST_CYCLES);
}

// The stage's sampling parameters into the sampling block (all but the seed).
void Lowerer::emitSampling(uint32_t s) {
    const Stage& st = p.stages[s];
    auto param = [&](uint32_t word, uint32_t value) {
        cb.li(kTmp, value);
        cb.op(Op::ST, {kTmp, kZero}, BLUE_LM_SAMPLING + word);
    };
    param(BLUE_SP_TEMP, floatBits(st.temperature));
    param(BLUE_SP_TOP_K, st.top_k);
    param(BLUE_SP_TOP_P, floatBits(st.top_p));
    param(BLUE_SP_MIN_P, floatBits(st.min_p));
    param(BLUE_SP_REPEAT_PENALTY, floatBits(st.repeat_penalty));
    param(BLUE_SP_REPEAT_LAST_N, st.repeat_last_n);
    param(BLUE_SP_PRESENCE, floatBits(0.0f));
    param(BLUE_SP_FREQUENCY, floatBits(0.0f));
    param(BLUE_SP_HIST_ADDR, hist_base);
}

// Generation after the prefill (its first token is in the sampling block) into the slot at
// `into.slot`. A request's own stage run counts its tokens against max_tokens and the budget and
// is cancelled by its flag; a fork branch (vm/cascade_abi.h) stops at kCap and at its parent's
// cancel flag (kParent, kMark), and leaves the budget to the join.
void Lowerer::emitGenerate(uint32_t s, const GenInto& into, CodeBuilder::Label done) {
    const Stage& st = p.stages[s];
    const LoadedModel& lm = models[stage_model[s]];
    const uint32_t stats = stats_base + s * BLUE_CAS_STAGE_WORDS;
    const uint32_t target = into.slot;
    cb.li(kGen, 0);
    // The token in kTok is generated: check the stop rules, append it to the slot and count it;
    // its T = 1 entropy and log-probability are local[reg + entropy_at], local[reg + logprob_at].
    auto accept = [&](uint8_t reg, uint32_t entropy_at, uint32_t logprob_at) {
        if (into.branch) {
            cb.jump(Op::BGEU, {kGen, kCap}, done);
        } else {
            cb.li(kTmp, st.max_tokens);
            cb.jump(Op::BGEU, {kGen, kTmp}, done);
            if (p.budget) {
                cb.li(kTmp, p.budget);
                cb.jump(Op::BGEU, {kTotal, kTmp}, done);
            }
        }
        for (uint32_t id : lm.eog) {
            cb.li(kTmp, id);
            cb.jump(Op::BEQ, {kTok, kTmp}, done);
        }
        cb.op(Op::LD, {kLen, kZero}, target);
        cb.li(kTmp, into.cap);
        cb.jump(Op::BGEU, {kLen, kTmp}, done);
        cb.op(Op::ST, {kTok, kLen}, target + 1);
        cb.op(Op::ADDI, {kLen, kLen}, 1);
        cb.op(Op::ST, {kLen, kZero}, target);
        cb.op(Op::ADDI, {kGen, kGen}, 1);
        if (!into.branch) cb.op(Op::ADDI, {kTotal, kTotal}, 1);
        cb.op(Op::ST, {kGen, kZero}, stats + BLUE_CAS_ST_TOKENS);
        cb.op(Op::LD, {kF1, reg}, entropy_at);
        cb.op(Op::LD, {kF2, kZero}, stats + BLUE_CAS_ST_ENT_SUM);
        cb.op(Op::FADD, {kF2, kF2, kF1});
        cb.op(Op::ST, {kF2, kZero}, stats + BLUE_CAS_ST_ENT_SUM);
        cb.op(Op::LD, {kF2, kZero}, stats + BLUE_CAS_ST_ENT_MAX);
        cb.op(Op::FMAX, {kF2, kF2, kF1});
        cb.op(Op::ST, {kF2, kZero}, stats + BLUE_CAS_ST_ENT_MAX);
        cb.op(Op::LD, {kF1, reg}, logprob_at);
        cb.op(Op::LD, {kF2, kZero}, stats + BLUE_CAS_ST_LP_SUM);
        cb.op(Op::FADD, {kF2, kF2, kF1});
        cb.op(Op::ST, {kF2, kZero}, stats + BLUE_CAS_ST_LP_SUM);
        // Stop strings: the slot's last tokens (of this run) equal one of them; they are dropped.
        for (const std::string& stop : st.stops) {
            std::vector<uint32_t> seq = tokensOf(stop, true);
            uint32_t at = addConsts(seq);
            auto cmp = cb.newLabel(), match = cb.newLabel(), next = cb.newLabel();
            cb.li(kN, uint32_t(seq.size()));
            cb.jump(Op::BLTU, {kGen, kN}, next);
            cb.li(kJ, 0);
            cb.bind(cmp);
            cb.jump(Op::BGEU, {kJ, kN}, match);
            cb.op(Op::SUB, {kWord, kLen, kN});
            cb.op(Op::ADD, {kWord, kWord, kJ});
            cb.op(Op::LD, {kWord, kWord}, target + 1);
            cb.op(Op::LDK, {kWord2, kJ}, at);
            cb.jump(Op::BNE, {kWord, kWord2}, next);
            cb.op(Op::ADDI, {kJ, kJ}, 1);
            cb.jump(Op::JMP, {}, cmp);
            cb.bind(match);
            cb.op(Op::SUB, {kLen, kLen, kN});
            cb.op(Op::ST, {kLen, kZero}, target);
            cb.jump(Op::JMP, {}, done);
            cb.bind(next);
        }
        if (into.branch) {
            cb.op(Op::INFLAG, {kFlagWord, kParent});
            cb.jump(Op::BEQ, {kFlagWord, kMark}, done);
        } else {
            cb.op(Op::INFLAG, {kFlagWord, kIid});
            cb.jump(Op::BEQ, {kFlagWord, kCancelMark}, cancel_label);
        }
    };
    if (st.speculate.empty()) {
        // Decode: take the sampled token, accept it, feed it back.
        auto decode = cb.newLabel();
        cb.bind(decode);
        cb.op(Op::LD, {kTok, kZero}, BLUE_LM_SAMPLING + BLUE_SP_OUT_TOKEN);
        accept(kZero, BLUE_LM_SAMPLING + BLUE_SP_OUT_ENTROPY, BLUE_LM_SAMPLING + BLUE_SP_OUT_LOGPROB);
        if (!into.branch) emitStreamFlush(streamHold(s));  // a branch's tokens are not the slot's
        cb.li(kTmp, lm.ctx);
        cb.jump(Op::BGEU, {kPos, kTmp}, done);
        cb.op(Op::ST, {kTok, kPos}, hist_base);
        cb.li(kArgRows, 1);
        cb.op(Op::MOV, {kArgPos, kPos});
        cb.op(Op::ADDI, {kArgTokens, kPos}, hist_base);
        cb.op(Op::ADDI, {kPos, kPos}, 1);
        cb.op(Op::ST, {kPos, kZero}, BLUE_LM_SAMPLING + BLUE_SP_HIST_LEN);
        cb.op(Op::RUN, {kArgRows}, lm.block);
        cb.jump(Op::JMP, {}, decode);
    } else {
        emitSpeculation(s, accept, done);
    }
}

// Prefill of the prompt in history[0, kPrompt) through `block`, in chunks; each chunk samples,
// and the last chunk's draw is draw 0 of the run whatever the chunk size, so sampled text does
// not depend on how the prompt was split. Leaves kPos = kPrompt.
void Lowerer::emitPrefill(uint32_t block, uint8_t end) {
    auto prefill = cb.newLabel(), chunk_ok = cb.newLabel();
    cb.li(kPos, 0);
    cb.li(kChunk, opt.chunk);
    cb.li(kArgSampling, BLUE_LM_SAMPLING);
    cb.bind(prefill);
    cb.op(Op::SUB, {kArgRows, end, kPos});
    cb.jump(Op::BLTU, {kArgRows, kChunk}, chunk_ok);
    cb.op(Op::MOV, {kArgRows, kChunk});
    cb.bind(chunk_ok);
    cb.op(Op::MOV, {kArgPos, kPos});
    cb.op(Op::ADDI, {kArgTokens, kPos}, hist_base);
    cb.op(Op::ADD, {kPos, kPos, kArgRows});
    cb.op(Op::ST, {kPos, kZero}, BLUE_LM_SAMPLING + BLUE_SP_HIST_LEN);
    cb.op(Op::ST, {kZero, kZero}, BLUE_LM_SAMPLING + BLUE_SP_COUNTER);
    cb.op(Op::RUN, {kArgRows}, block);
    cb.jump(Op::BLTU, {kPos, end}, prefill);
}

// A select stage: the prompt but its last token is prefilled once; then each option runs as
// [last prompt token, option tokens] from that position, SCORE sums the option's log-likelihood,
// and the most likely option (the first of equals) is written to the slot.
void Lowerer::emitSelect(uint32_t s, CodeBuilder::Label done) {
    const Stage& st = p.stages[s];
    const LoadedModel& lm = models[stage_model[s]];
    const uint32_t stats = stats_base + s * BLUE_CAS_STAGE_WORDS;
    const uint32_t target = slot_addr[size_t(slotIndex(st.target))];
    auto skip_prefill = cb.newLabel();
    cb.op(Op::ADDI, {kN, kPrompt}, uint32_t(-1));
    cb.jump(Op::BEQZ, {kN}, skip_prefill);
    emitPrefill(lm.score_block, kN);
    cb.bind(skip_prefill);
    cb.li(kE, 0);
    std::vector<std::vector<uint32_t>> opts;
    std::vector<uint32_t> at;
    for (const std::string& o : st.options) {
        opts.push_back(tokensOf(o, true));
        at.push_back(addConsts(opts.back()));
    }
    for (uint32_t j = 0; j < opts.size(); ++j) {
        auto loop = cb.newLabel(), copied = cb.newLabel(), keep = cb.newLabel();
        cb.li(kI, 0);
        cb.li(kN, uint32_t(opts[j].size()));
        cb.bind(loop);
        cb.jump(Op::BGEU, {kI, kN}, copied);
        cb.op(Op::LDK, {kWord, kI}, at[j]);
        cb.op(Op::ADD, {kTmp, kPrompt, kI});
        cb.op(Op::ST, {kWord, kTmp}, hist_base);
        cb.op(Op::ADDI, {kI, kI}, 1);
        cb.jump(Op::JMP, {}, loop);
        cb.bind(copied);
        cb.li(kArgRows, uint32_t(opts[j].size() + 1));
        cb.op(Op::ADDI, {kArgPos, kPrompt}, uint32_t(-1));
        cb.op(Op::ADDI, {kArgTokens, kArgPos}, hist_base);
        cb.op(Op::RUN, {kArgRows}, lm.score_block);
        cb.op(Op::TLD, {kF1, kZero}, score_sum);
        if (j > 0) {
            cb.op(Op::FLT, {kTmp, kF2, kF1});
            cb.jump(Op::BEQZ, {kTmp}, keep);
        }
        cb.op(Op::MOV, {kF2, kF1});
        cb.li(kE, j);
        cb.bind(keep);
    }
    // Write the chosen option.
    for (uint32_t j = 0; j < opts.size(); ++j) {
        auto next = cb.newLabel(), loop = cb.newLabel();
        cb.li(kTmp, j);
        cb.jump(Op::BNE, {kE, kTmp}, next);
        cb.op(Op::LD, {kLen, kZero}, target);
        cb.li(kI, 0);
        cb.li(kN, uint32_t(opts[j].size()));
        cb.bind(loop);
        cb.jump(Op::BGEU, {kI, kN}, done);
        cb.op(Op::LDK, {kWord, kI}, at[j]);
        cb.op(Op::ST, {kWord, kLen}, target + 1);
        cb.op(Op::ADDI, {kLen, kLen}, 1);
        cb.op(Op::ST, {kLen, kZero}, target);
        cb.op(Op::ADDI, {kI, kI}, 1);
        cb.op(Op::ADDI, {kTotal, kTotal}, 1);  // written tokens count against the budget
        cb.op(Op::ST, {kI, kZero}, stats + BLUE_CAS_ST_TOKENS);
        cb.jump(Op::JMP, {}, loop);
        cb.bind(next);
    }
}

// Speculative decoding after both prefills (the target's first token is in the sampling block).
// kPos: tokens committed to the history; the target has seen all but the last, the draft all
// before position kDraftNext. Each step the draft proposes K tokens (SAMPLEQ keeps its
// distributions), the target scores the K+1 positions in one pass and SPEC accepts a prefix and
// draws the next token; the accepted tokens and that one go through `accept`. K grows by one
// after a step that accepted everything and shrinks by one after one that accepted under half.
void Lowerer::emitSpeculation(uint32_t s, const std::function<void(uint8_t, uint32_t, uint32_t)>& accept,
                              CodeBuilder::Label done) {
    const Stage& st = p.stages[s];
    const LoadedModel& target = models[stage_model[s]];
    const LoadedModel& draft = models[stage_draft[s]];
    const uint32_t stats = stats_base + s * BLUE_CAS_STAGE_WORDS;
    auto step = cb.newLabel(), draft_loop = cb.newLabel(), drafted = cb.newLabel(), emit = cb.newLabel();
    auto emit_draft = cb.newLabel(), emitted = cb.newLabel(), grow = cb.newLabel(), adapted = cb.newLabel();
    auto k_ok = cb.newLabel(), k_ok2 = cb.newLabel(), k_ok3 = cb.newLabel();
    // The first token, then the loop.
    cb.op(Op::LD, {kTok, kZero}, spec_base + BLUE_SPEC_TOKEN);
    accept(kZero, spec_base + BLUE_SPEC_ENTROPY, spec_base + BLUE_SPEC_LOGPROB);
    cb.op(Op::ST, {kTok, kPos}, hist_base);
    cb.op(Op::ADDI, {kPos, kPos}, 1);
    cb.op(Op::MOV, {kDraftNext, kPrompt});
    cb.li(kSpecK, st.speculate_tokens);
    cb.bind(step);
    emitStreamFlush(streamHold(s));
    cb.li(kTmp, st.max_tokens);
    cb.jump(Op::BGEU, {kGen, kTmp}, done);
    if (p.budget) {
        cb.li(kTmp, p.budget);
        cb.jump(Op::BGEU, {kTotal, kTmp}, done);
    }
    // K for this step: at most what max_tokens, the budget and the context leave after the
    // token SPEC adds.
    cb.op(Op::MOV, {kK, kSpecK});
    cb.li(kTmp, st.max_tokens - 1);
    cb.op(Op::SUB, {kTmp, kTmp, kGen});  // max_tokens - 1 - generated (>= 0: accept stopped otherwise)
    cb.jump(Op::BGEU, {kTmp, kK}, k_ok);
    cb.op(Op::MOV, {kK, kTmp});
    cb.bind(k_ok);
    cb.li(kTmp, std::min(target.ctx, draft.ctx));
    cb.op(Op::SUB, {kTmp, kTmp, kPos});  // positions left; the verify runs K+1 from kPos - 1
    cb.jump(Op::BGEU, {kTmp, kK}, k_ok2);
    cb.op(Op::MOV, {kK, kTmp});
    cb.bind(k_ok2);
    if (p.budget) {
        cb.li(kTmp, p.budget - 1);
        cb.op(Op::SUB, {kTmp, kTmp, kTotal});
        cb.jump(Op::BGEU, {kTmp, kK}, k_ok3);
        cb.op(Op::MOV, {kK, kTmp});
    }
    cb.bind(k_ok3);
    // Draft: its first run covers what it has not seen (the last committed token, and d_K of a
    // step that accepted everything), then one row per proposal.
    cb.li(kJ, 0);
    cb.jump(Op::BEQZ, {kK}, drafted);
    cb.op(Op::SUB, {kArgRows, kPos, kDraftNext});
    cb.op(Op::MOV, {kArgPos, kDraftNext});
    cb.op(Op::ADDI, {kArgTokens, kDraftNext}, hist_base);
    cb.bind(draft_loop);
    cb.op(Op::ST, {kJ, kZero}, BLUE_LM_SAMPLING + BLUE_SP_ROW);
    cb.op(Op::RUN, {kArgRows}, draft.draft_block);
    cb.op(Op::LD, {kWord, kZero}, BLUE_LM_SAMPLING + BLUE_SP_OUT_TOKEN);
    cb.op(Op::ADD, {kTmp, kPos, kJ});
    cb.op(Op::ST, {kWord, kTmp}, hist_base);  // d_(j+1) at position kPos + j
    cb.op(Op::ADDI, {kJ, kJ}, 1);
    cb.li(kArgRows, 1);
    cb.op(Op::ADD, {kArgPos, kPos, kJ});
    cb.op(Op::ADDI, {kArgPos, kArgPos}, uint32_t(-1));
    cb.op(Op::ADDI, {kArgTokens, kArgPos}, hist_base);
    cb.jump(Op::BLTU, {kJ, kK}, draft_loop);
    cb.bind(drafted);
    // Verify the K+1 positions from kPos - 1 in one target pass.
    cb.op(Op::ADDI, {kArgRows, kK}, 1);
    cb.op(Op::ADDI, {kArgPos, kPos}, uint32_t(-1));
    cb.op(Op::ADDI, {kArgTokens, kArgPos}, hist_base);
    cb.op(Op::RUN, {kArgRows}, target.verify_block);
    cb.op(Op::LD, {kAcc, kZero}, spec_base + BLUE_SPEC_ACCEPTED);
    for (auto [word, reg] : {std::pair<uint32_t, uint8_t>{BLUE_CAS_ST_DRAFTED, kK}, {BLUE_CAS_ST_ACCEPTED, kAcc}}) {
        cb.op(Op::LD, {kTmp, kZero}, stats + word);
        cb.op(Op::ADD, {kTmp, kTmp, reg});
        cb.op(Op::ST, {kTmp, kZero}, stats + word);
    }
    cb.op(Op::LD, {kTmp, kZero}, stats + BLUE_CAS_ST_PASSES);
    cb.op(Op::ADDI, {kTmp, kTmp}, 1);
    cb.op(Op::ST, {kTmp, kZero}, stats + BLUE_CAS_ST_PASSES);
    // The draft saw d1..d_(K-1): it is in step up to position kPos + min(accepted, K - 1).
    auto no_draft = cb.newLabel();
    cb.jump(Op::BEQZ, {kK}, no_draft);
    cb.op(Op::ADDI, {kTmp, kK}, uint32_t(-1));
    cb.op(Op::MINU, {kTmp, kTmp, kAcc});
    cb.op(Op::ADD, {kDraftNext, kPos, kTmp});
    cb.bind(no_draft);
    // Adapt K.
    cb.jump(Op::BEQ, {kAcc, kK}, grow);
    cb.op(Op::SHLI, {kTmp, kAcc}, 1);
    cb.jump(Op::BGEU, {kTmp, kK}, adapted);  // accepted at least half
    cb.li(kTmp, 1);
    cb.jump(Op::BGEU, {kTmp, kSpecK}, adapted);
    cb.op(Op::ADDI, {kSpecK, kSpecK}, uint32_t(-1));
    cb.jump(Op::JMP, {}, adapted);
    cb.bind(grow);
    cb.jump(Op::BEQZ, {kK}, adapted);
    cb.li(kTmp, BLUE_SPEC_MAX_DRAFT);
    cb.jump(Op::BGEU, {kSpecK, kTmp}, adapted);
    cb.op(Op::ADDI, {kSpecK, kSpecK}, 1);
    cb.bind(adapted);
    // Emit the accepted drafts (already in the history), then SPEC's token.
    cb.li(kE, 0);
    cb.bind(emit);
    cb.jump(Op::BGEU, {kE, kAcc}, emit_draft);
    cb.op(Op::ADD, {kTmp, kPos, kE});
    cb.op(Op::LD, {kTok, kTmp}, hist_base);
    cb.jump(Op::JMP, {}, emitted);
    cb.bind(emit_draft);
    cb.op(Op::LD, {kTok, kZero}, spec_base + BLUE_SPEC_TOKEN);
    cb.op(Op::ADD, {kTmp, kPos, kE});
    cb.op(Op::ST, {kTok, kTmp}, hist_base);
    cb.bind(emitted);
    accept(kE, spec_base + BLUE_SPEC_ENTROPY, spec_base + BLUE_SPEC_LOGPROB);
    cb.op(Op::ADDI, {kE, kE}, 1);
    cb.jump(Op::BGEU, {kAcc, kE}, emit);
    cb.op(Op::ADD, {kPos, kPos, kE});
    cb.jump(Op::JMP, {}, step);
}

void Lowerer::emitStmts(const std::vector<Stmt>& body, uint32_t depth) {
    for (const Stmt& s : body) {
        switch (s.kind) {
            case Stmt::STAGE:
            case Stmt::RUN: {
                uint32_t step = ++next_step;
                emitStage(s.stage);
                emitCheckpoint(step, s.stage);
                cb.bind(step_labels[step]);
                break;
            }
            case Stmt::IF: {
                auto yes = cb.newLabel(), no = cb.newLabel(), end = cb.newLabel();
                emitCond(*s.cond, yes, no);
                cb.bind(yes);
                emitStmts(s.body, depth);
                cb.jump(Op::JMP, {}, end);
                cb.bind(no);
                emitStmts(s.else_body, depth);
                cb.bind(end);
                break;
            }
            case Stmt::REPEAT: {
                uint8_t counter = uint8_t(kLoop0 + depth);
                auto top = cb.newLabel(), end = cb.newLabel();
                cb.li(counter, 0);
                cb.bind(top);
                cb.li(kTmp, s.count);
                cb.jump(Op::BGEU, {counter, kTmp}, end);
                loop_ends.push_back(end);
                emitStmts(s.body, depth + 1);
                loop_ends.pop_back();
                cb.op(Op::ADDI, {counter, counter}, 1);
                cb.jump(Op::JMP, {}, top);
                cb.bind(end);
                break;
            }
            case Stmt::SCORE: emitScore(s); break;
            case Stmt::BREAK: {
                if (!s.cond) {
                    cb.jump(Op::JMP, {}, loop_ends.back());
                } else {
                    auto go_on = cb.newLabel();
                    emitCond(*s.cond, loop_ends.back(), go_on);
                    cb.bind(go_on);
                }
                break;
            }
        }
    }
}

// `score KERNEL over SLOT`: copies the slot (length, then tokens) into the kernel's slot tensor
// and runs its block; the results stay in the kernel's result tensor for conditions to read.
// `filter SLOT with KERNEL into TARGET` then copies the slot the kernel wrote into TARGET.
void Lowerer::emitScore(const Stmt& s) {
    const LoweredKernel& lk = kernels_.kernels[s.kernel];
    const uint32_t slot = slot_addr[size_t(slotIndex(s.score_slot))];
    auto loop = cb.newLabel(), done = cb.newLabel();
    cb.op(Op::LD, {kN, kZero}, slot);
    cb.op(Op::TST, {kN, kZero}, lk.slot_tensor);
    cb.li(kI, 0);
    cb.bind(loop);
    cb.jump(Op::BGEU, {kI, kN}, done);
    cb.op(Op::LD, {kWord, kI}, slot + 1);
    cb.op(Op::ADDI, {kTmp, kI}, 1);
    cb.op(Op::TST, {kWord, kTmp}, lk.slot_tensor);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, loop);
    cb.bind(done);
    cb.li(kArgRows, 1);
    cb.op(Op::RUN, {kArgRows}, kernels_.blocks.at(&s));
    if (s.score_into.empty()) return;
    // `filter`: the kernel's slot into the target, its length clamped to the target's capacity.
    const uint32_t target = slot_addr[size_t(slotIndex(s.score_into))];
    auto copy = cb.newLabel(), copied = cb.newLabel();
    cb.op(Op::TLD, {kN, kZero}, lk.out_tensor);
    cb.li(kTmp, slot_cap[size_t(slotIndex(s.score_into))]);
    cb.op(Op::MINU, {kN, kN, kTmp});
    cb.op(Op::ST, {kN, kZero}, target);
    cb.li(kI, 0);
    cb.bind(copy);
    cb.jump(Op::BGEU, {kI, kN}, copied);
    cb.op(Op::ADDI, {kTmp, kI}, 1);
    cb.op(Op::TLD, {kWord, kTmp}, lk.out_tensor);
    cb.op(Op::ST, {kWord, kI}, target + 1);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, copy);
    cb.bind(copied);
}

// A stage's statistics records (vm/cascade_abi.h).
void Lowerer::emitStageRecords(uint32_t stage) {
    const uint32_t st = stats_base + stage * BLUE_CAS_STAGE_WORDS;
    const std::pair<uint32_t, Op> records[] = {
        {BLUE_CAS_ST_STATE, Op::OUTU}, {BLUE_CAS_ST_TOKENS, Op::OUTU}, {BLUE_CAS_ST_ENT_SUM, Op::OUTF},
        {BLUE_CAS_ST_ENT_MAX, Op::OUTF}, {BLUE_CAS_ST_LP_SUM, Op::OUTF}, {BLUE_CAS_ST_CYCLES, Op::OUTU},
        {BLUE_CAS_ST_RUNS, Op::OUTU}, {BLUE_CAS_ST_DRAFTED, Op::OUTU}, {BLUE_CAS_ST_ACCEPTED, Op::OUTU},
        {BLUE_CAS_ST_PASSES, Op::OUTU}, {BLUE_CAS_ST_CHOICE, Op::OUTU}, {BLUE_CAS_ST_BRANCHES, Op::OUTU},
        {BLUE_CAS_ST_SIBLINGS, Op::OUTU}, {BLUE_CAS_ST_BRANCH_TOKENS, Op::OUTU}};
    static_assert(BLUE_CAS_OUT_STAGE_RECORDS == 14, "the records below are the protocol");
    for (auto [word, op] : records) {
        cb.op(Op::LD, {kTmp, kZero}, st + word);
        cb.op(op, {kTmp});
    }
}

// A slot's length record and its tokens (`slot`: 0 is input).
void Lowerer::emitSlotRecords(size_t slot) {
    auto loop = cb.newLabel(), done = cb.newLabel();
    cb.op(Op::LD, {kN, kZero}, slot_addr[slot]);
    cb.op(Op::OUTU, {kN});
    cb.li(kI, 0);
    cb.bind(loop);
    cb.jump(Op::BGEU, {kI, kN}, done);
    cb.op(Op::LD, {kTok, kI}, slot_addr[slot] + 1);
    cb.op(Op::OUTT, {kTok});
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, loop);
    cb.bind(done);
}

void Lowerer::emitOutputs() {
    for (uint32_t s = 0; s < p.stages.size(); ++s) emitStageRecords(s);
    for (size_t k = 1; k < slot_addr.size(); ++k) emitSlotRecords(k);
}

void Lowerer::emitProgram() {
    auto next = cb.newLabel(), halt = cb.newLabel(), reject = cb.newLabel(), clear = cb.newLabel();
    finish_label = cb.newLabel();
    cancel_label = cb.newLabel();
    ckpt_marker = m.addConstString(BLUE_CAS_CHECKPOINT_MARKER);
    stream_marker = m.addConstString(BLUE_CAS_STREAM_MARKER);
    time_marker = m.addConstString(BLUE_CAS_STAGE_TIME_MARKER);
    step_labels.assign(steps + 1, 0);
    for (uint32_t k = 1; k <= steps; ++k) step_labels[k] = cb.newLabel();
    cb.li(kZero, 0);
    cb.li(kMinus1, 0xFFFFFFFFu);
    cb.op(Op::IID, {kIid});
    if (max_fork) {
        // Between requests an instance runs other requests' fork branches.
        auto request = cb.newLabel();
        emitIdle(next, request, halt);
        cb.bind(request);
    } else {
        cb.bind(next);
        cb.op(Op::INRECV, {kSlot});
        cb.jump(Op::BEQ, {kSlot, kMinus1}, halt);
    }
    cb.li(kTmp, BLUE_CAS_REQ_TAG);
    cb.op(Op::INLD, {kTag, kSlot, kTmp});
    cb.op(Op::OUTBEGIN, {kTag});
    cb.op(Op::ADDI, {kCancelMark, kTag}, 1);  // the host sets this instance's flag to tag + 1 to cancel
    emitRequest(reject);
    // Every statistic and slot starts empty.
    cb.li(kI, stats_base);
    cb.li(kN, slots_base);
    cb.bind(clear);
    cb.op(Op::ST, {kZero, kI}, 0);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::BLTU, {kI, kN}, clear);
    for (size_t k = 1; k < slot_addr.size(); ++k) cb.op(Op::ST, {kZero, kZero}, slot_addr[k]);
    cb.li(kRuns, 0);
    cb.li(kTotal, 0);
    cb.li(kStreamed, 0);
    emitRestore();
    emitStmts(p.body, 0);
    cb.bind(finish_label);
    emitOutputs();
    auto ended = cb.newLabel();
    cb.op(Op::OUTEND, {kTag});
    cb.jump(Op::JMP, {}, ended);
    cb.bind(reject);
    cb.op(Op::INFREE, {kSlot});
    cb.bind(cancel_label);
    cb.op(Op::OUTEND, {kTag});
    cb.bind(ended);
    if (max_fork) {
        cb.li(kTmp, BLUE_CAS_HEAP_ACTIVE);
        cb.op(Op::ATOMADD, {kWord, kTmp, kMinus1});
    }
    cb.jump(Op::JMP, {}, next);
    cb.bind(halt);
    cb.op(Op::HALT);
    for (uint32_t s = 0; s < p.stages.size(); ++s) {
        if (p.stages[s].fork > 1) emitBranch(s);
    }
}

static std::string joinNames(const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
    return out;
}

Result<Module> Lowerer::run() {
    BLUE_TRY(openModels());
    layout();
    BLUE_TRY(checkNames());
    BLUE_TRY(checkSizes());
    if (uint64_t(hist_base) + max_ctx > BLUE_MAX_LOCAL_WORDS) {
        return errorAt({1, 1}, strFormat("slots and context need %llu words per instance, more than %u",
                                         (unsigned long long)(hist_base + max_ctx), BLUE_MAX_LOCAL_WORDS));
    }
    uint32_t table = 0xFFFFFFFFu;
    if (spec_base) {
        // The draft's distributions for the drafted positions, per instance.
        TensorDecl t;
        t.name = "speculation/q";
        t.cls = BLUE_TC_INSTANCE;
        t.ndim = 2;
        t.ne = {models[0].cfg.n_vocab, BLUE_SPEC_MAX_DRAFT, 1, 1};
        m.tensors.push_back(t);
        table = uint32_t(m.tensors.size() - 1);
    }
    bool selects = false;
    for (const Stage& st : p.stages) selects |= !st.options.empty() || !st.judge.empty();
    if (selects) {
        TensorDecl t;
        t.name = "select/score";
        t.cls = BLUE_TC_INSTANCE;
        t.ne = {1, 1, 1, 1};
        m.tensors.push_back(t);
        score_sum = uint32_t(m.tensors.size() - 1);
    }
    m.layout.max_rows = opt.max_rows;  // before the forward blocks: an MoE layer's expert map is sized by it
    for (size_t k = 0; k < models.size(); ++k) {
        LoadedModel& lm = models[k];
        m.externs.push_back(lm.path);
        std::string prefix = lm.name + "/";
        // Only the blocks some stage runs: every block's dispatches are recorded in every cycle.
        if (lm.as_plain) lm.block = addForwardBlock(m, cb, lm.gguf, lm.cfg, opt.kv_type, lm.ctx, uint32_t(k), prefix);
        if (lm.as_draft) {
            lm.draft_block = addForwardBlock(m, cb, lm.gguf, lm.cfg, opt.kv_type, lm.ctx, uint32_t(k), prefix, ForwardHead::SampleQ, table);
        }
        if (lm.as_score) {
            lm.score_block = addForwardBlock(m, cb, lm.gguf, lm.cfg, opt.kv_type, lm.ctx, uint32_t(k), prefix, ForwardHead::Score, score_sum);
        }
        if (lm.as_target) {
            lm.verify_block = addForwardBlock(m, cb, lm.gguf, lm.cfg, opt.kv_type, lm.ctx, uint32_t(k), prefix, ForwardHead::Verify, table);
        }
    }
    BLUE_TRY(lowerKernels(p, [this](const std::string& n) { return slotIndex(n); },
                          [this](const std::string& text) { return tokensOf(text, true); }, slot_cap, m, &kernels_));
    m.layout.regs = kRegs;
    m.layout.local_words = hist_base + max_ctx + (max_fork ? 1 + branch_cap : 0);
    if (max_fork) {
        fork_records = std::max<uint32_t>(1, opt.fork_records);
        uint64_t heap = BLUE_CAS_HEAP_FORKS + uint64_t(fork_records) * forkRecordWords();
        if (heap > BLUE_MAX_HEAP_WORDS) {
            return errorAt({1, 1}, strFormat("%u fork records need %llu heap words, more than %u",
                                             fork_records, (unsigned long long)heap, BLUE_MAX_HEAP_WORDS));
        }
        m.layout.heap_words = m.layout.heap_static = uint32_t(heap);
        m.layout.mailbox_cap = max_fork;  // a parent's siblings never wait to send
        branch_labels.assign(p.stages.size(), 0);
        for (uint32_t s = 0; s < p.stages.size(); ++s) {
            if (p.stages[s].fork > 1) branch_labels[s] = cb.newLabel();
        }
    }
    m.layout.in_slots = opt.in_slots;
    countSteps(p.body, 0);
    // A request carries a resume block with every slot at full capacity (durable slots).
    uint64_t request_words = uint64_t(BLUE_CAS_REQ_HEADER) + resumeWords() + p.input_capacity + 1;
    if (request_words > BLUE_MAX_IN_SLOT_WORDS) {
        return errorAt({1, 1}, strFormat("a request with the slots' state needs %llu words, more than %u; shrink the slots",
                                         (unsigned long long)request_words, BLUE_MAX_IN_SLOT_WORDS));
    }
    m.layout.in_slot_words = uint32_t(request_words);
    m.layout.max_rows = opt.max_rows;
    m.layout.max_steps = 4096;
    {
        // The stream slot is the answer's: the last output (see CascadeInfo::stream_slot).
        const std::string& last = p.outputs.empty() ? p.stages.back().target : p.outputs.back();
        stream_slot = uint32_t(slotIndex(last));
        uint32_t n = 0;
        numberSteps(p.body, &n);
        stream_steps.assign(steps + 1, false);
        planStream(p.body, false);
    }
    emitProgram();
    BLUE_TRY(cb.finish());
    std::vector<std::string> names, stages, slots, caps, outputs;
    for (const LoadedModel& lm : models) names.push_back(lm.name);
    for (const Stage& st : p.stages) stages.push_back(st.name);
    for (const SlotDecl& s : p.slots) {
        slots.push_back(s.name);
        caps.push_back(std::to_string(s.capacity));
    }
    if (p.outputs.empty()) {
        // The slot the last stage in the source writes.
        outputs.push_back(std::to_string(slotIndex(p.stages.back().target) - 1));
    }
    for (const std::string& o : p.outputs) outputs.push_back(std::to_string(slotIndex(o) - 1));
    m.meta = {{kMetaKind, kCascadeKind},
              {kMetaCtx, std::to_string(max_ctx)},
              {"cascade.models", joinNames(names)},
              {"cascade.stages", joinNames(stages)},
              {"cascade.slots", joinNames(slots)},
              {"cascade.slot_capacity", joinNames(caps)},
              {"cascade.outputs", joinNames(outputs)},
              {"cascade.input_capacity", std::to_string(p.input_capacity)},
              {"cascade.vocab", vocabFingerprint(vocab())},
              {"cascade.steps", std::to_string(steps)},
              {"cascade.loops", std::to_string(loop_depth)},
              {"cascade.stream", std::to_string(stream_slot - 1)}};
    if (max_fork) m.meta.push_back({"cascade.fork", std::to_string(max_fork)});
    {
        // The longest window a stage applies repetition penalties over, and that stage: a device
        // whose compiler limits loops refuses it at load (host: maxPenaltyWindow).
        uint32_t window = 0;
        const Stage* widest = nullptr;
        for (const Stage& st : p.stages) {
            uint32_t w = st.repeat_penalty != 1.0f ? std::min(st.repeat_last_n, max_ctx) : 0;
            if (w > window) {
                window = w;
                widest = &st;
            }
        }
        if (widest) {
            m.meta.push_back({"cascade.penalty_window", std::to_string(window)});
            m.meta.push_back({"cascade.penalty_stage", widest->name});
        }
    }
    if (p.prefer_loc.line) {
        m.meta.push_back({"cascade.prefer", std::to_string(slotIndex(p.prefer_chosen) - 1) + "," +
                                                std::to_string(slotIndex(p.prefer_rejected) - 1)});
    }
    Status s = verifyModule(m);
    if (!s) return s.prefix("compiled cascade fails verification (compiler bug)");
    return std::move(m);
}

std::vector<std::string> splitNames(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    if (s.empty()) return out;
    for (;;) {
        size_t comma = s.find(',', start);
        out.push_back(s.substr(start, comma - start));
        if (comma == std::string::npos) return out;
        start = comma + 1;
    }
}

}  // namespace cascade

using cascade::Lowerer;
using cascade::splitNames;

Status parseModelOverride(const std::string& arg, std::map<std::string, std::string>* models) {
    size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size()) {
        return Status::error("--model needs NAME=PATH, got '" + arg + "'");
    }
    (*models)[arg.substr(0, eq)] = arg.substr(eq + 1);
    return Status::ok();
}

Result<Module> compileCascade(std::string_view source, const std::string& file, const CascadeOptions& options) {
    BLUE_TRY_ASSIGN(cascade::Program p, parseCascade(source, file));
    Lowerer lw{p, options, {}, {}, {}};
    return lw.run();
}

Result<Module> compileCascadeFile(const std::string& path, const CascadeOptions& options) {
    auto bytes = MappedFile::open(path);
    if (!bytes) return bytes.status();
    std::string_view text(reinterpret_cast<const char*>(bytes->bytes().data()), bytes->bytes().size());
    return compileCascade(text, path, options);
}

std::string vocabFingerprint(const Tokenizer& t) {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&](std::string_view s) {
        for (char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
        h = (h ^ 0xFF) * 0x100000001b3ull;
    };
    mix(t.model() == TokenizerModel::Spm ? "spm" : "bpe");
    for (int32_t i = 0; i < t.vocabSize(); ++i) mix(t.tokenText(i));
    return strFormat("%d:%016llx", t.vocabSize(), (unsigned long long)h);
}

Result<CascadeInfo> CascadeInfo::fromModule(const Module& m) {
    const std::string* kind = m.metaValue(kMetaKind);
    if (!kind || *kind != kCascadeKind) return Status::error("not a cascade module (compile one with `bluec cascade`)");
    auto get = [&](const char* key) -> Result<std::string> {
        const std::string* v = m.metaValue(key);
        if (!v) return BLUE_ERROR("cascade module has no '%s' metadata", key);
        return *v;
    };
    auto number = [](const std::string& s, uint32_t* out) {
        char* end = nullptr;
        unsigned long v = std::strtoul(s.c_str(), &end, 10);
        if (s.empty() || *end || v > 0xFFFFFFFFul) return false;
        *out = uint32_t(v);
        return true;
    };
    CascadeInfo info;
    BLUE_TRY_ASSIGN(std::string models, get("cascade.models"));
    BLUE_TRY_ASSIGN(std::string stages, get("cascade.stages"));
    BLUE_TRY_ASSIGN(std::string slots, get("cascade.slots"));
    BLUE_TRY_ASSIGN(std::string caps, get("cascade.slot_capacity"));
    BLUE_TRY_ASSIGN(std::string outputs, get("cascade.outputs"));
    BLUE_TRY_ASSIGN(std::string input, get("cascade.input_capacity"));
    BLUE_TRY_ASSIGN(info.vocab, get("cascade.vocab"));
    info.models = splitNames(models);
    info.stages = splitNames(stages);
    info.slots = splitNames(slots);
    if (info.models.size() != m.externs.size()) return Status::error("cascade module: its models and external files differ in number");
    std::vector<std::string> cap_text = splitNames(caps);
    if (cap_text.size() != info.slots.size()) return Status::error("cascade module: slot capacities do not match its slots");
    for (const std::string& c : cap_text) {
        uint32_t v = 0;
        if (!number(c, &v)) return BLUE_ERROR("cascade module: bad slot capacity '%s'", c.c_str());
        info.slot_capacity.push_back(v);
    }
    for (const std::string& o : splitNames(outputs)) {
        uint32_t v = 0;
        if (!number(o, &v) || v >= info.slots.size()) return BLUE_ERROR("cascade module: bad output slot '%s'", o.c_str());
        info.outputs.push_back(v);
    }
    if (!number(input, &info.input_capacity)) return Status::error("cascade module: bad input capacity");
    // Durable slots and preferences came later: modules without them load, and --wal refuses
    // them (steps 0).
    if (const std::string* v = m.metaValue("cascade.steps"); v && !number(*v, &info.steps)) return Status::error("cascade module: bad step count");
    if (const std::string* v = m.metaValue("cascade.loops"); v && !number(*v, &info.loops)) return Status::error("cascade module: bad loop depth");
    if (const std::string* v = m.metaValue("cascade.stream")) {
        uint32_t slot = 0;
        if (!number(*v, &slot) || slot >= info.slots.size()) return BLUE_ERROR("cascade module: bad stream slot '%s'", v->c_str());
        info.stream_slot = int32_t(slot);
    }
    if (const std::string* v = m.metaValue("cascade.fork"); v && (!number(*v, &info.max_fork) || info.max_fork > 64)) {
        return Status::error("cascade module: bad cascade.fork");
    }
    if (const std::string* v = m.metaValue("cascade.penalty_window"); v && !number(*v, &info.penalty_window)) {
        return Status::error("cascade module: bad cascade.penalty_window");
    }
    if (const std::string* v = m.metaValue("cascade.penalty_stage")) info.penalty_stage = *v;
    if (const std::string* v = m.metaValue("cascade.prefer")) {
        std::vector<std::string> pair = splitNames(*v);
        uint32_t a = 0, b = 0;
        if (pair.size() != 2 || !number(pair[0], &a) || !number(pair[1], &b) || a >= info.slots.size() ||
            b >= info.slots.size() || a == b) {
            return BLUE_ERROR("cascade module: bad preference '%s'", v->c_str());
        }
        info.prefer_chosen = int32_t(a);
        info.prefer_rejected = int32_t(b);
    }
    return info;
}

Status rebindModel(Module& m, uint32_t extern_index, const GgufFile& gguf, const std::string& path) {
    if (extern_index >= m.externs.size()) return BLUE_ERROR("no model %u in the module", extern_index);
    for (TensorDecl& t : m.tensors) {
        if (t.source != DataSource::EXTERN || t.extern_index != extern_index) continue;
        size_t slash = t.name.find('/');
        std::string name = slash == std::string::npos ? t.name : t.name.substr(slash + 1);
        const GgufTensor* g = gguf.findTensor(name);
        if (!g) return BLUE_ERROR("%s has no tensor '%s'", path.c_str(), name.c_str());
        bool same_shape = true;
        for (uint32_t d = 0; d < 4; ++d) same_shape &= uint64_t(g->ne[d]) == t.ne[d];
        if (g->type != t.dtype || !same_shape || g->n_bytes != t.bytes) {
            return BLUE_ERROR("%s: tensor '%s' is %s [%lld, %lld] but the cascade was compiled for %s [%llu, %llu]; "
                              "compile it again with `bluec cascade --model`",
                              path.c_str(), name.c_str(), std::string(dtypeName(g->type)).c_str(), (long long)g->ne[0],
                              (long long)g->ne[1], std::string(dtypeName(t.dtype)).c_str(), (unsigned long long)t.ne[0], (unsigned long long)t.ne[1]);
        }
        t.offset = g->offset;
    }
    m.externs[extern_index] = path;
    return Status::ok();
}

}  // namespace blue
