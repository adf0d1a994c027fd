// The contract between the generation program the compiler writes (compiler/lower_model.cpp),
// the host that feeds it requests (host/llm/), the SAMPLE op (vm/tensor_ops_llm.cpp and
// shaders/sample.comp): the request message layout, the per-instance local-memory layout, the
// sampling-parameter block and the forward block's arguments. Plain #defines, shared with GLSL.
#ifndef BLUE_VM_LLM_ABI_H
#define BLUE_VM_LLM_ABI_H

// ---- a generation request: one input-ring message (u32 words) ------------------------------
#define BLUE_REQ_TAG 0          // request id, echoed by OUTEND
#define BLUE_REQ_PROMPT_LEN 1   // prompt tokens
#define BLUE_REQ_MAX_NEW 2      // tokens to generate at most
#define BLUE_REQ_TEMP 3         // f32; 0 = greedy
#define BLUE_REQ_TOP_K 4        // 0 = off
#define BLUE_REQ_TOP_P 5        // f32; 1 = off
#define BLUE_REQ_MIN_P 6        // f32; 0 = off
#define BLUE_REQ_REPEAT_PENALTY 7  // f32; 1 = off
#define BLUE_REQ_REPEAT_LAST_N 8   // tokens the penalties look back over
#define BLUE_REQ_PRESENCE 9     // f32 presence penalty; 0 = off
#define BLUE_REQ_FREQUENCY 10   // f32 frequency penalty; 0 = off
#define BLUE_REQ_SEED 11
#define BLUE_REQ_N_STOP 12      // extra stop tokens (<= BLUE_REQ_MAX_STOP)
#define BLUE_REQ_STOP 13        // [BLUE_REQ_MAX_STOP] stop token ids
#define BLUE_REQ_MAX_STOP 8
#define BLUE_REQ_FLAGS 21       // BLUE_REQ_FLAG_*
#define BLUE_REQ_START 22       // position of the first prompt token: the instance's history and
                                // KV cache already hold the positions before it (a restored
                                // conversation, host/memory/kv_snapshot.h); 0 for a fresh one
#define BLUE_REQ_LOGPROBS 23    // 0: none; 1 + N: after each token, its log-probability and the N
                                // most likely tokens' (N <= BLUE_MAX_TOP_LOGPROBS), output records
                                // ahead of its OUTT: OUTF lp, then N x (OUT id, OUTF lp)
#define BLUE_REQ_SESSION 24     // 0: none; 1 + s: a conversation kept in session slot s of the
                                // program's session store (module metadata llm.sessions): before
                                // prefill the instance takes the slot's tokens and the KV rows of
                                // the ones the prompt shares; after the request it writes its
                                // tokens and new KV rows back
#define BLUE_REQ_HEADER 25      // then the grammar section: G, then G words (G = 0: none; else a
                                // packed automaton, BLUE_GR_* below); then the prompt tokens
#define BLUE_REQ_LAYOUT 5       // this layout's version (module metadata llm.request)
#define BLUE_MAX_TOP_LOGPROBS 20

#define BLUE_REQ_FLAG_IGNORE_EOG 1u  // do not stop at the model's end-of-generation tokens (benchmarks)
#define BLUE_REQ_FLAG_NO_PREFIX 2u   // recompute the whole prompt: do not reuse the KV rows of the
                                     // tokens it shares with what the instance processed last
#define BLUE_REQ_FLAG_SESSION_NEW 8u  // the session slot holds nothing of this conversation (a
                                     // new or evicted session): nothing is loaded from it
#define BLUE_REQ_FLAG_EMBED 4u       // an embedding: run the prompt through the program's embed
                                     // block (module metadata llm.pooling says how it pools) and
                                     // emit the pooled vector (OUTF per element) instead of
                                     // generating; MEAN and FIRST pooling also recompute the prompt

// ---- POOL's modes (embeddings: the output-normed hidden states of a prompt pooled to one vector)
#define BLUE_POOL_MEAN 0u
#define BLUE_POOL_FIRST 1u
#define BLUE_POOL_LAST 2u

// ---- structured output: a request's grammar automaton (SAMPLEG), u32 words -------------------
// A deterministic automaton over UTF-8 bytes (compiler/grammar/dfa.h builds it): a token is
// allowed when its bytes lead from the current state to a live state; end-of-generation tokens
// only in an accepting state. The instance's copy lives in an INSTANCE tensor (the program copies
// the request's section there with INTCPY); SAMPLEG advances BLUE_GR_STATE by the token the
// program emitted (BLUE_GR_PENDING) before it masks.
#define BLUE_GR_STATES 0        // states (0: no grammar)
#define BLUE_GR_CLASSES 1       // byte classes
#define BLUE_GR_STATE 2         // the current state
#define BLUE_GR_PENDING 3       // 1 + the token emitted since (0: none): SAMPLEG first advances the
                                // state by its bytes. The program sets it for each token it emits,
                                // so the samples of prefill chunks before the last move nothing.
#define BLUE_GR_CLASS_MAP 4     // [64]: the 256 bytes' classes, 4 per word (byte b: bits 8 * (b % 4))
#define BLUE_GR_ACCEPT (BLUE_GR_CLASS_MAP + 64)  // [ceil(states / 32)] accepting bits, then
                                // [ceil(states * classes / 2)] next states, 2 per word (entry
                                // s * classes + c: bits 16 * (e % 2)); 0xFFFF: the byte is not allowed
#define BLUE_GR_DEAD 0xFFFFu
#define BLUE_GR_MASKED (-1e30)    // the logit of a token the grammar does not allow (finite: sums stay numbers)
#define BLUE_GR_HEADER_WORDS BLUE_GR_ACCEPT

// The model's token bytes (a constant I32 tensor the compiler writes from the vocabulary):
// word t < vocab = offset << 10 | kind << 8 | length; the bytes follow, 4 per word, little end
// first, at byte offset (vocab * 4 + offset) of the tensor.
#define BLUE_TB_TEXT 0u         // text: its bytes (as decoding writes them, spaces restored)
#define BLUE_TB_END 1u          // end of generation (no bytes)
#define BLUE_TB_NONE 2u         // control, unused or longer than 255 bytes: never under a grammar

// ---- sampling parameters and results: a block in the instance's local memory ---------------
#define BLUE_SP_TEMP 0
#define BLUE_SP_TOP_K 1
#define BLUE_SP_TOP_P 2
#define BLUE_SP_MIN_P 3
#define BLUE_SP_REPEAT_PENALTY 4
#define BLUE_SP_REPEAT_LAST_N 5
#define BLUE_SP_PRESENCE 6
#define BLUE_SP_FREQUENCY 7
#define BLUE_SP_SEED 8
#define BLUE_SP_COUNTER 9       // RNG counter: the index of the token being sampled
#define BLUE_SP_HIST_ADDR 10    // local address of the token history
#define BLUE_SP_HIST_LEN 11     // tokens in the history (the penalties' window ends there)
#define BLUE_SP_OUT_TOKEN 12    // written by SAMPLE
#define BLUE_SP_OUT_ENTROPY 13  // f32, nats, of the distribution after penalties at T = 1
#define BLUE_SP_OUT_LOGPROB 14  // f32, log-probability of the chosen token (same distribution)
#define BLUE_SP_ROW 15          // SAMPLEQ: the row of its table that gets the distribution drawn from
#define BLUE_SP_TOP_N 16        // SAMPLE: alternatives to write (0..BLUE_MAX_TOP_LOGPROBS; 0 = none)
#define BLUE_SP_TOP_ADDR 17     // local address of [2 * TOP_N] words SAMPLE writes: (id, f32 log-
                                // probability) of the most likely tokens of the distribution the
                                // chosen token's log-probability is of, in order, ties lower id first
#define BLUE_SP_WORDS 20

// ---- local memory of a generating instance ---------------------------------------------------
#define BLUE_LM_SAMPLING 0                // the sampling block
#define BLUE_LM_STOP (BLUE_SP_WORDS)      // [BLUE_REQ_MAX_STOP] stop tokens of this request
#define BLUE_LM_HISTORY (BLUE_SP_WORDS + BLUE_REQ_MAX_STOP)  // [ctx] prompt and generated tokens
// then [2 * BLUE_MAX_TOP_LOGPROBS] at BLUE_LM_HISTORY + ctx: SAMPLE's alternatives (BLUE_SP_TOP_ADDR)
// then one word: how many positions' KV rows the instance holds for its history (the positions
// its last request processed). A request whose prompt starts with the same tokens starts after
// them (prefix reuse, decided by the program with INCMP; the program reports it with an OUTU
// record, the count of prompt tokens not recomputed, right after OUTBEGIN, when it is not 0).

// ---- arguments of the forward block ------------------------------------------------------------
#define BLUE_FA_ROWS 0      // rows (tokens) this instance runs in this step
#define BLUE_FA_POS 1       // position of the first row
#define BLUE_FA_TOKENS 2    // local address of the first row's token
#define BLUE_FA_SAMPLING 3  // local address of the sampling block
#define BLUE_FA_COUNT 4
#define BLUE_FA_SPEC 4      // verify blocks (SPEC) only: local address of the speculation block

// ---- speculative decoding: what SPEC writes (a block in the instance's local memory) ----------
// The verify block runs K+1 rows: the last accepted token, then the K draft tokens d1..dK
// (SAMPLEQ wrote the draft's distribution for d_i into row i-1 of the table).
#define BLUE_SPEC_MAX_DRAFT 8                        // K at most (rows of the table)
#define BLUE_SPEC_ACCEPTED 0                         // draft tokens accepted (0..K)
#define BLUE_SPEC_TOKEN 1                            // the token after them: correction or bonus
#define BLUE_SPEC_ENTROPY 2                          // f32 [K+1]: T = 1 entropy at each emitted token
#define BLUE_SPEC_LOGPROB (BLUE_SPEC_ENTROPY + BLUE_SPEC_MAX_DRAFT + 1)  // f32 [K+1]: its log-probability
#define BLUE_SPEC_MODE (BLUE_SPEC_LOGPROB + BLUE_SPEC_MAX_DRAFT + 1)  // written by the program:
                             // 0 verify; 1 prefill (no drafts: draw the next token from the last row)
#define BLUE_SPEC_WORDS (BLUE_SPEC_MODE + 1)

#endif  // BLUE_VM_LLM_ABI_H
