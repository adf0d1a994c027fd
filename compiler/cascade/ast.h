// The cascade language's syntax tree (see cascade.h for the language). The parser fills it; the
// lowering (lower.cpp) checks names and sizes against the models and emits the module.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace blue::cascade {

struct Loc {
    uint32_t line = 0, col = 0;  // 1-based
};

// A condition: comparisons of stage statistics and slot lengths with numbers, `contains`, and
// `and` / `or` / `not` over them.
struct Cond {
    enum Kind { CMP, CONTAINS, AND, OR, NOT } kind = CMP;
    Loc loc;
    // CMP: subject.metric op number; CONTAINS: subject contains text
    std::string subject, metric, op, text;
    Loc metric_loc, text_loc;
    double number = 0;
    std::unique_ptr<Cond> a, b;
};

// One part of a prompt: literal text, or the contents of a slot (`input` is the task).
struct PromptPart {
    bool literal = false;
    std::string text;  // the literal, or the slot's name
    Loc loc;
};

// `fork K`: at most this many branches (the parser's bound; the lowering's claim check relies on it).
inline constexpr uint32_t kMaxBranches = 16;

struct Stage {
    std::string name;
    Loc loc;
    std::string model;
    Loc model_loc;
    std::vector<PromptPart> prompt;
    Loc prompt_loc;
    std::string target;  // the slot the stage writes
    Loc target_loc;
    bool append = false;  // `append SLOT` keeps what is there; `write SLOT` replaces it
    uint32_t max_tokens = 64;
    float temperature = 0.8f, top_p = 1.0f, min_p = 0.0f, repeat_penalty = 1.0f;
    uint32_t top_k = 0, repeat_last_n = 64;
    std::string speculate;  // a draft model for speculative decoding (empty: none)
    Loc speculate_loc;
    uint32_t speculate_tokens = 4;  // the draft's first K; adapts to the acceptance rate
    std::vector<std::string> options;  // `select`: score these and write the most likely
    std::vector<Loc> option_locs;
    Loc select_loc;
    std::vector<std::string> stops;
    std::vector<Loc> stop_locs;
    std::unique_ptr<Cond> skip_if;
    // `fork K`: K branches run at once as sibling instances, each with its own seed, and
    // `join RULE` keeps one: "logprob" (highest mean log-probability, the default), "first" (the
    // first to finish) or "judge" (highest mean log-likelihood under the model `judge`).
    uint32_t fork = 1;
    Loc fork_loc;
    std::string join;  // empty: logprob
    Loc join_loc;
    std::string judge;
    Loc judge_loc;
};

struct Stmt {
    enum Kind { STAGE, RUN, IF, REPEAT, BREAK, SCORE } kind = STAGE;
    Loc loc;
    uint32_t stage = 0;  // STAGE, RUN: index into Program::stages
    std::unique_ptr<Cond> cond;  // IF; BREAK (null: unconditional)
    std::vector<Stmt> body, else_body;  // IF, REPEAT
    uint32_t count = 0;  // REPEAT
    // SCORE (`score KERNEL over SLOT [param N]`, `filter SLOT with KERNEL into TARGET`): index
    // into Program::kernels, the slot read, `param`.
    uint32_t kernel = 0;
    std::string score_slot;
    Loc score_slot_loc;
    uint32_t score_param = 0;
    std::string score_param_text;  // `param "text"`: the text's one token is the param
    Loc score_param_loc;
    // `filter SLOT with KERNEL into TARGET`: the slot the kernel writes (empty for `score`).
    std::string score_into;
    Loc score_into_loc;
};

// `kernel NAME = "file.comp"` (GLSL compute) or "file.spv" (SPIR-V): a custom tensor op over a
// slot, run by `score` (or by `filter`, which also writes a slot); its results are `NAME.value`
// (word 0) and `NAME.value1`..`value15`.
struct KernelUse {
    std::string name, path;  // path as written (relative to the source file)
    Loc loc, path_loc;
};

struct ModelDecl {
    std::string name, path;
    Loc loc, path_loc;
};

struct SlotDecl {
    std::string name;
    uint32_t capacity = 0;
    Loc loc;
};

struct Program {
    std::string file;  // for messages
    std::vector<ModelDecl> models;
    std::vector<KernelUse> kernels;
    std::vector<SlotDecl> slots;  // without `input`
    uint32_t input_capacity = 256;
    Loc input_loc;
    std::vector<Stage> stages;
    std::vector<Stmt> body;
    std::vector<std::string> outputs;
    std::vector<Loc> output_locs;
    uint32_t budget = 0;  // total generated tokens per request (0: no limit)
    uint32_t context = 0;  // per model (0: min(trained context, 2048))
    // `prefer CHOSEN over REJECTED`: a preference pair for traces (empty: none).
    std::string prefer_chosen, prefer_rejected;
    Loc prefer_loc, prefer_chosen_loc, prefer_rejected_loc;
};

}  // namespace blue::cascade
