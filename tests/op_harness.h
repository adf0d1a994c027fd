// The harness of the per-op GPU-vs-reference test (tests/test_ops_gpu.cpp): builds small modules
// whose instances fill their inputs and RUN one block together with ragged row counts, runs them
// on the GPU and on the reference machine, and compares the tensors they leave by normalised
// error. Block rows may land in a different order on the GPU (instances claim rows with atomics),
// so ROWS tensors are compared row by row, matched through a tag each row carries: the block
// embeds `tag_table[token] = token + 1` into the ROWS tensor `tag` (0 for out-of-range tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compiler/code_builder.h"
#include "tests/gpu_fixture.h"
#include "host/machine.h"
#include "vm/interp.h"
#include "vm/llm_abi.h"
#include "vm/module.h"
#include "vm/weights.h"

namespace blue::test {

// Local memory of a test instance: the sampling block and token history where vm/llm_abi.h puts
// them, the block's tokens from kTokens on.
constexpr uint32_t kTokens = 64;
// The block arguments every RUN passes (vm/llm_abi.h's forward block): rows, position of the
// first row, local address of the first row's token, local address of the sampling block.
constexpr uint32_t kBlockArgs = BLUE_FA_COUNT + 1;
// ... and a fifth, the speculation block's address (SPEC, vm/llm_abi.h), here.
constexpr uint32_t kSpecBlock = kTokens + 16;

// What one instance does: stores its words, RUNs the "fill" block once over `prefill` rows at
// positions 0.. (when the module has one), then RUNs the "step" block `runs` times over `rows`
// rows at position `pos`. After each step RUN (when the module asked for outputsAfterRun()) it
// writes the sampling block's token (OUT), entropy and log-probability (OUTF).
struct InstancePlan {
    uint32_t rows = 1;
    uint32_t pos = 0;
    std::vector<uint32_t> tokens;  // [rows] the step rows' tokens
    uint32_t prefill = 0;  // fill rows; their tokens are prefill_token, prefill_token + 1, ...
    uint32_t prefill_token = 0;
    uint32_t runs = 1;
    std::vector<std::pair<uint32_t, std::vector<float>>> tensor_words;  // INSTANCE tensor, values
    std::vector<std::pair<uint32_t, uint32_t>> local_words;             // address, word
};

// Builds one test module. Tensor indices returned are operands for the block instructions.
class OpModule {
  public:
    OpModule(uint32_t vocab, uint32_t max_rows, uint32_t local_words, uint32_t seed);

    // An activation without data.
    uint32_t tensor(const std::string& name, uint32_t cls, DType t, std::vector<uint64_t> ne);
    // A WEIGHT or GLOBAL tensor holding `values`, encoded row by row as `t` with quantizeRow.
    uint32_t data(const std::string& name, uint32_t cls, DType t, std::vector<uint64_t> ne,
                  const std::vector<float>& values);
    // A ROWS f32 input: every block starts by embedding row `token` of a random table
    // [width, vocab] with values in [lo, hi).
    uint32_t rowsInput(const std::string& name, uint32_t width, float lo, float hi);
    // The same with the table's values given ([vocab][width]).
    uint32_t rowsInput(const std::string& name, uint32_t width,
                       const std::vector<float>& table_values);
    std::vector<float> random(size_t n, float lo, float hi);

    // Appends a tensor instruction to the step block or to the fill block.
    void step(Op op, std::vector<uint32_t> operands) { step_.push_back({op, std::move(operands)}); }
    void fill(Op op, std::vector<uint32_t> operands) { fill_.push_back({op, std::move(operands)}); }
    void outputsAfterRun() { outputs_after_run_ = true; }
    // After each step RUN, also write these local words (OUT, in order).
    void outputWords(std::vector<uint32_t> addresses) { output_words_ = std::move(addresses); }

    // The verified module running `plans` (instance i follows plans[i]); fails the test when the
    // module does not verify. Call once.
    Module build(const std::vector<InstancePlan>& plans);

    const Module& module() const { return m_; }
    uint32_t vocab() const { return vocab_; }
    uint32_t tagTensor() const { return tag_; }
    std::mt19937& rng() { return rng_; }

  private:
    struct Instr {
        Op op;
        std::vector<uint32_t> operands;
    };
    uint32_t emitBlock(CodeBuilder& cb, const char* name, const std::vector<Instr>& instrs);
    void emitInstance(CodeBuilder& cb, const InstancePlan& plan, uint32_t fill_block,
                      uint32_t step_block);

    Module m_;
    uint32_t vocab_;
    std::mt19937 rng_;
    std::vector<std::pair<uint32_t, uint32_t>> inputs_;  // ROWS tensor, its table
    uint32_t tag_ = 0;
    std::vector<Instr> step_, fill_;
    bool outputs_after_run_ = false;
    std::vector<uint32_t> output_words_;
};

// Names of the kernels the modules built so far dispatch (kernelName of every instruction).
std::set<std::string>& kernelsRun();

// Both machines after running a module to the end. The module must outlive it.
struct BothMachines {
    const Module* module = nullptr;
    std::unique_ptr<WeightSource> weights;
    std::unique_ptr<RefMachine> ref;
    std::unique_ptr<GpuMachine> gpu;
    RunReport ref_report, gpu_report;

    std::vector<uint8_t> gpuBytes(uint32_t tensor) const;
    const std::vector<uint8_t>& refBytes(uint32_t tensor) const;
};

// Runs `m` with `instances` instances on both machines; fails the test unless both runs end
// with every instance halted.
// Null when an emulated device profile refuses the module (a tensor larger than its page).
// `on` picks another device than the shared one (with its pipelines).
// `vram_budget`: GpuOptions::vram_budget (0: none), to run a module's weights from host memory
// (and MoE experts through an expert cache), read in place on every device.
// `tweak`: changes the GPU machine's options (e.g. the kernel shapes) before it is made.
std::unique_ptr<BothMachines> runOnBoth(const Module& m, uint32_t instances, Gpu* on = nullptr,
                                        uint64_t vram_budget = 0,
                                        const std::function<void(GpuOptions&)>& tweak = nullptr);

// max |gpu - ref| and max |ref| over the compared elements; a NaN or infinity where the other
// machine has none counts as an infinite error.
struct ErrorStat {
    double max_err = 0, max_ref = 0;
    size_t compared = 0;
    void add(double gpu, double ref);
    double normalised() const { return max_err / (max_ref + 1e-30); }
};

// Compares a tensor's values (F32 or F16). INSTANCE tensors: every instance's slice. ROWS
// tensors: rows [0, rows) of the last block run, matched by their tags (fails the test when the
// two machines' tags differ or repeat).
ErrorStat compareTensor(const BothMachines& b, uint32_t tensor, uint32_t rows);

// The tag (token + 1) each of the first `rows` rows of the last block run carries.
std::vector<uint32_t> rowTags(const BothMachines& b, uint32_t rows, bool gpu);

}  // namespace blue::test
