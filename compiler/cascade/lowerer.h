// The cascade lowering's internals (lower.cpp, lower_fork.cpp): the control program's registers,
// the models a cascade opens, and the Lowerer that checks a parsed cascade and emits its module.
// Not an interface: only the lowering's own files include it.
#pragma once

#include <bit>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "compiler/cascade/cascade.h"
#include "compiler/cascade/lower_kernel.h"
#include "compiler/code_builder.h"
#include "compiler/gguf.h"
#include "compiler/model_config.h"
#include "compiler/tokenizer.h"
#include "vm/cascade_abi.h"
#include "vm/llm_abi.h"

namespace blue::cascade {

inline constexpr uint32_t kNoToken = 0xFFFFFFFFu;

inline uint32_t floatBits(float f) { return std::bit_cast<uint32_t>(f); }

// Registers of the cascade program. Loop counters take kLoop0 + nesting depth.
enum Reg : uint8_t {
    kSlot = 1, kTmp, kTmp2, kTag, kSeed, kRuns, kTotal, kPos, kPrompt, kGen, kTok, kI, kN, kWord,
    kF1, kF2, kMinus1, kLen, kIid,
    kArgRows = 20, kArgPos, kArgTokens, kArgSampling, kArgSpec,  // RUN arguments (BLUE_FA_*)
    kCancelMark, kFlagWord, kChunk, kJ, kWord2, kZero,
    kSpecK, kK, kAcc, kE, kDraftNext,  // speculative decoding
    kFork, kBranch, kCap, kOwn,        // fork and join: the record, the branch, its token cap,
    kLoop0 = 40,                       // branches done; loop counters up to kLoop0 + 16
    kParent = 58, kMark,               // a branch's parent instance and its cancel mark
    kStreamed,                         // tokens of the stream slot streamed so far (vm/cascade_abi.h)
};
inline constexpr uint32_t kRegs = 64;

struct LoadedModel {
    std::string name, path;  // path: as the module records it
    GgufFile gguf;
    ModelConfig cfg;
    Tokenizer tok;
    uint32_t ctx = 0, block = 0, bos = kNoToken;
    uint32_t draft_block = 0, verify_block = 0;  // when a stage uses it as draft / speculative target
    uint32_t score_block = 0;                    // when a stage selects with it
    bool as_plain = false, as_draft = false, as_target = false, as_score = false;
    std::vector<uint32_t> eog;
    bool used = false;
};

struct Lowerer {
    const Program& p;
    const CascadeOptions& opt;
    std::vector<LoadedModel> models;
    std::vector<uint32_t> stage_model;  // per stage: index into models
    std::vector<uint32_t> stage_draft;  // per stage: its speculate model (when it has one)
    uint32_t spec_base = 0;             // the speculation block, when a stage speculates
    uint32_t score_sum = 0;             // SCORE's result tensor, when a stage selects
    Module m;
    CodeBuilder cb{&m};
    // Local memory layout.
    uint32_t stats_base = BLUE_SP_WORDS, slots_base = 0, hist_base = 0, max_ctx = 0;
    std::vector<uint32_t> slot_addr;  // [0] input, then p.slots
    std::vector<uint32_t> slot_cap;
    CodeBuilder::Label finish_label = 0, cancel_label = 0;
    // Fork and join: records in the heap (vm/cascade_abi.h), a local slot a branch generates
    // into, and per fork stage the code of one branch (a subroutine).
    uint32_t fork_records = 0, max_fork = 0, branch_slot = 0, branch_cap = 0;
    std::vector<CodeBuilder::Label> branch_labels;  // by stage (0: not a fork)
    std::vector<uint32_t> stage_judge;              // by stage: the judge's model index
    LoweredKernels kernels_;                        // custom kernels (lower_kernel.h)
    std::vector<CodeBuilder::Label> loop_ends;
    // Durable slots (vm/cascade_abi.h): stage statements are steps 1..steps in source order;
    // step_labels[k] is the code right after step k's checkpoint, where a resume continues.
    uint32_t steps = 0, loop_depth = 0, next_step = 0, ckpt_marker = 0;
    std::vector<CodeBuilder::Label> step_labels;
    // Streaming (vm/cascade_abi.h, BLUE_CAS_STREAM_MARKER): the stream slot (0: none) and, per
    // step id, whether that stage statement's write of it is final (planStream).
    uint32_t stream_slot = 0, stream_marker = 0, time_marker = 0;
    std::vector<bool> stream_steps;
    std::map<const Stmt*, uint32_t> step_of;

    Status errorAt(Loc l, const std::string& msg) const {
        return BLUE_ERROR("%s:%u:%u: %s", p.file.c_str(), l.line, l.col, msg.c_str());
    }

    // Slot index (0: input), or -1.
    int slotIndex(const std::string& name) const {
        if (name == "input") return 0;
        for (size_t i = 0; i < p.slots.size(); ++i) {
            if (p.slots[i].name == name) return int(i + 1);
        }
        return -1;
    }
    int stageIndex(const std::string& name) const {
        for (size_t i = 0; i < p.stages.size(); ++i) {
            if (p.stages[i].name == name) return int(i);
        }
        return -1;
    }
    const Tokenizer& vocab() const { return models[0].tok; }

    // Tokens of literal text. `mid`: the text continues earlier tokens (not the start of a
    // prompt), so SentencePiece's space prefix must not add a word boundary that is not there.
    std::vector<uint32_t> tokensOf(const std::string& text, bool mid) const {
        const Tokenizer& t = vocab();
        std::string s = text;
        bool spm_prefix = mid && t.addSpacePrefix();
        if (spm_prefix && !s.empty() && s[0] == ' ') s.erase(0, 1);  // the prefix puts it back
        else spm_prefix = spm_prefix && !s.empty();
        std::vector<int32_t> ids = t.encode(s, false, true);
        if (spm_prefix && !ids.empty() && !(text[0] == ' ')) {
            // The tokenizer put a space before text that has none: drop it from the first piece.
            std::string_view first = t.tokenText(ids[0]);
            const std::string_view kSpace = "\xE2\x96\x81";
            if (first == kSpace) {
                ids.erase(ids.begin());
            } else if (first.substr(0, kSpace.size()) == kSpace) {
                int32_t bare = t.findToken(first.substr(kSpace.size()));
                if (bare >= 0) ids[0] = bare;
            }
        }
        return {ids.begin(), ids.end()};
    }

    uint32_t addConsts(const std::vector<uint32_t>& words) {
        uint32_t at = uint32_t(m.consts.size());
        m.consts.insert(m.consts.end(), words.begin(), words.end());
        return at;
    }

    Status openModels();
    Status checkNames();
    Status checkCond(const Cond& c, Loc before) const;
    Status checkStmts(const std::vector<Stmt>& body);
    Status checkSizes();
    Status checkPrefer() const;
    void layout();
    void emitProgram();
    void emitStmts(const std::vector<Stmt>& body, uint32_t depth);
    void emitStage(uint32_t s);
    void emitScore(const Stmt& s);
    // Streaming the answer slot and stage times (lower.cpp).
    void numberSteps(const std::vector<Stmt>& body, uint32_t* n);
    bool replacesStream(const std::vector<Stmt>& body) const;
    bool planStream(const std::vector<Stmt>& body, bool after);
    uint32_t streamHold(uint32_t stage) const;
    void emitStreamFlush(uint32_t hold);
    void emitStageEnd(uint32_t stage);
    void emitPrompt(uint32_t s);
    void emitRunStart(uint32_t s);
    void emitSampling(uint32_t s);
    // Where emitGenerate appends: a slot's local address and capacity; `branch`: a fork branch.
    struct GenInto {
        uint32_t slot = 0, cap = 0;
        bool branch = false;
    };
    void emitGenerate(uint32_t s, const GenInto& into, CodeBuilder::Label done);
    // Fork and join (lower_fork.cpp).
    void emitFork(uint32_t s, CodeBuilder::Label done);
    void emitJoin(uint32_t s);
    void emitJudge(uint32_t s);
    void emitBranch(uint32_t s);
    void emitForkScan(CodeBuilder::Label after);
    void emitIdle(CodeBuilder::Label next, CodeBuilder::Label request, CodeBuilder::Label halt);
    uint32_t forkRecordWords() const;
    uint32_t branchWords(uint32_t s) const { return BLUE_CAS_BRANCH_WORDS + p.stages[s].max_tokens; }
    uint32_t forkPromptAt(uint32_t s) const { return BLUE_CAS_FORK_HEADER + p.stages[s].fork * branchWords(s); }
    void emitPrefill(uint32_t block, uint8_t end = kPrompt);
    void emitSelect(uint32_t s, CodeBuilder::Label done);
    void emitSpeculation(uint32_t s, const std::function<void(uint8_t, uint32_t, uint32_t)>& accept,
                         CodeBuilder::Label done);
    void emitCond(const Cond& c, CodeBuilder::Label yes, CodeBuilder::Label no);
    void emitCopy(uint32_t slot);
    void emitOutputs();
    void emitStageRecords(uint32_t stage);
    void emitSlotRecords(size_t slot);
    void countSteps(const std::vector<Stmt>& body, uint32_t depth);
    uint32_t resumeWords() const;
    void emitRequest(CodeBuilder::Label reject);
    void emitRestore();
    void emitCheckpoint(uint32_t step, uint32_t stage);
    Result<Module> run();
};

}  // namespace blue::cascade
