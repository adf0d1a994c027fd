// Cascades: several models working in turn over a per-request thinking buffer, compiled to one
// Blue-IR module whose control code runs every stage, template, skip and loop decision on the GPU.
//
// The language (`.cas`), one statement per line, `#` comments:
//
//   model draft = "stories260K-q8_0.gguf"   # path relative to the source file
//   model target = "stories260K.gguf"
//   slot input[128]                         # the task's tokens (optional; default 256)
//   slot story[200]                         # a slot of the thinking buffer, capacity in tokens
//   budget 400                              # tokens generated per request over all stages
//   context 512                             # context per model (default: trained, at most 2048)
//
//   stage sketch {                          # a stage runs where it is written
//       model draft
//       prompt "Once upon a time" + input   # literal text, `input` and slots, joined by +
//       write story                         # replace the slot (`append story` extends it)
//       max_tokens 48
//       temperature 0.8                     # also top_k, top_p, min_p, repeat_penalty
//       stop ".", "\n"                      # stop strings, matched on their tokens
//   }
//   stage polish {
//       skip if sketch.entropy_mean < 0.5   # confident draft: keep it
//       model target
//       prompt story + " Then"
//       append story
//   }
//   repeat 3 {                              # a bounded loop
//       run polish                          # runs a stage written earlier again
//       break if story contains "The end"
//   }
//   if sketch.tokens >= 40 and not (story.length > 150) { ... } else { ... }
//   kernel count = "count.comp"             # a custom kernel: GLSL compute (.comp) or SPIR-V (.spv)
//   score count over story param " the"     # run it over a slot (param: a number or one token's text)
//   if count.value > 2 { ... }              # its results: value (word 0), value1 .. value15
//   filter story with drop into bare param ","  # a kernel that also writes a slot (binding 3)
//   output story                            # the slots the run prints (default: the last written)
//   prefer story over sketch                # traces: a preference pair (chosen over rejected)
//
//   stage draft {                           # best of 4: the branches run at once on sibling
//       prompt "Once upon a time"           # instances, each with its own seed
//       write story
//       fork 4
//       join logprob                        # keep the highest mean log-probability (default);
//   }                                       # or `join first`, or `join judge MODEL` (the highest
//                                           # mean log-likelihood under MODEL after the prompt)
//
// Conditions compare `STAGE.tokens`, `.entropy_mean`, `.entropy_max`, `.logprob_mean`, `.runs`,
// `SLOT.length` or `KERNEL.value`..`.value15` (after a `score` of it) with a number (<, <=, >,
// >=, ==, !=), or test `SLOT contains "text"`. A kernel keeps the contract of vm/kernel_abi.h;
// bluec compiles and checks it (compiler/cascade/kernel_source.h) and every loader checks it again.
// Literal text is tokenized when the cascade is compiled, with the models' shared vocabulary;
// models with different vocabularies are refused (tokens pass between stages as they are).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/cascade/ast.h"
#include "vm/dtype.h"
#include "vm/module.h"
#include "vm/status.h"

namespace blue {

struct CascadeOptions {
    // Model paths by name, replacing the source's (as given: relative to the working directory).
    std::map<std::string, std::string> models;
    // The folder the module is written to: model paths are recorded relative to it.
    std::string module_dir = ".";
    DType kv_type = DType::F16;
    uint32_t max_rows = 512;  // forward rows per step over all instances
    uint32_t chunk = 128;     // prompt tokens one instance prefills per step
    uint32_t in_slots = 64;
    uint32_t fork_records = 16;  // fork stages running at once over all requests (heap records)
};

// Parses a `--model NAME=PATH` argument (bluec cascade, bluevm run and serve) into `models`.
Status parseModelOverride(const std::string& arg, std::map<std::string, std::string>* models);

// Syntax only: every error is "FILE:LINE:COL: message".
Result<cascade::Program> parseCascade(std::string_view source, const std::string& file);

// Parses, checks against the models (which it opens) and lowers to a verified module.
Result<Module> compileCascade(std::string_view source, const std::string& file,
                              const CascadeOptions& options);
Result<Module> compileCascadeFile(const std::string& path, const CascadeOptions& options);

// What the host needs to run a compiled cascade, read back from the module's metadata.
struct CascadeInfo {
    std::vector<std::string> models;  // names, in extern order
    std::vector<std::string> stages;
    std::vector<std::string> slots;   // without `input`
    std::vector<uint32_t> slot_capacity;
    std::vector<uint32_t> outputs;    // indices into slots
    uint32_t input_capacity = 0;
    std::string vocab;                // fingerprint of the shared vocabulary
    uint32_t steps = 0;               // stage statements (checkpoint step ids 1..steps)
    uint32_t loops = 0;               // loop nesting levels (counters in checkpoints)
    int32_t prefer_chosen = -1, prefer_rejected = -1;  // `prefer`: indices into slots, or -1
    uint32_t max_fork = 0;            // the most branches a stage forks (0: none)
    // The longest window of tokens a stage applies repetition penalties over, and that stage's
    // name (0 and empty: no penalties, or a module compiled before this was recorded).
    uint32_t penalty_window = 0;
    std::string penalty_stage;
    // The slot whose final writes the program streams (the last output; vm/cascade_abi.h), or -1
    // for a module compiled before streaming.
    int32_t stream_slot = -1;
    static Result<CascadeInfo> fromModule(const Module& m);
};

// A fingerprint of a vocabulary (size, model, every token's text): models passing tokens to each
// other must have equal fingerprints.
class Tokenizer;
std::string vocabFingerprint(const Tokenizer& tokenizer);

// Points model `extern_index`'s weights at another GGUF file with the same tensors (a fine-tune
// of the same architecture and tensor types): every tensor is found by name and must have the
// type and shape the module was compiled for; the message names the first that differs. To swap
// in a model of other shapes or types, compile again (`bluec cascade --model NAME=PATH`).
class GgufFile;
Status rebindModel(Module& m, uint32_t extern_index, const GgufFile& gguf, const std::string& path);

inline constexpr const char* kCascadeKind = "cascade";

}  // namespace blue
