// Shared by the per-op GPU-vs-reference test files (test_ops_gpu*.cpp): the measurement log,
// ragged instance plans, and the cases that live outside test_ops_gpu.cpp.
#pragma once

#include <string>
#include <vector>

#include "tests/op_harness.h"

namespace blue::test {

// One compared tensor: its label, the measured max normalised error and its bound.
struct OpMeasure {
    std::string what;
    double err = 0, bound = 0;
};
std::vector<OpMeasure>& opMeasures();

// Checks that `tensor` (ROWS: the first `rows` rows of the last block run) matches within
// `bound` of max |ref|, plus `abs_bound` (an absolute error, for bounds that do not scale with
// the values), and logs the measurement.
void expectClose(const BothMachines& b, uint32_t tensor, uint32_t rows, double bound,
                 const std::string& what, double abs_bound = 0);

// One plan per instance with rows[i] rows at position pos[i]; every row gets a different random
// token of the module's vocabulary.
std::vector<InstancePlan> raggedPlans(OpModule& om, const std::vector<uint32_t>& rows,
                                      const std::vector<uint32_t>& pos);
uint32_t totalRows(const std::vector<InstancePlan>& plans);
std::string lowerName(DType t);

void ropeCase();                // test_ops_gpu_llm.cpp
void ropeqkCase();              // test_ops_gpu_llm.cpp
void kvstoreCase(DType cache);  // test_ops_gpu_llm.cpp
void ropekvCase(DType cache);   // test_ops_gpu_llm.cpp
void kvcopyCase(DType cache);   // test_ops_gpu_llm.cpp
void attnCase(DType cache);     // test_ops_gpu_llm.cpp
void attnxCase(DType cache);    // test_ops_gpu_llm.cpp
void kvstorepCase(DType cache); // test_ops_gpu_kvpages.cpp
void attnpCase(DType cache);    // test_ops_gpu_kvpages.cpp
void pgcopyCase(DType cache);   // test_ops_gpu_kvpages.cpp
void kvcopypCase(DType cache);  // test_ops_gpu_kvpages.cpp
// The sampling cases run once per history length in kSampleHistories (GpuOptions::sample_history:
// on a CPU driver, sampling's width; at vocabularies of 2,000 tokens 64, 8, 16 and 32 lanes).
inline constexpr uint32_t kSampleHistories[] = {0, 64, 3500, 5000};
void sampleCase(uint32_t history);   // test_ops_gpu_sample.cpp (with history 0: sampleTopCase too)
void sampleTopCase();           // test_ops_gpu_sample.cpp
void samplegCase(uint32_t history);  // test_ops_gpu_sampleg.cpp
void sampleqCase(uint32_t history);  // test_ops_gpu_spec.cpp
void specCase();                // test_ops_gpu_spec.cpp
void scoreCase();               // test_ops_gpu_spec.cpp
void moerouteCase();            // test_ops_gpu_moe.cpp
void moemmCase(DType weights);  // test_ops_gpu_moe.cpp
void moemixCase();              // test_ops_gpu_moe.cpp

}  // namespace blue::test
