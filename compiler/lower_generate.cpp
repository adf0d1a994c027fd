// The generation program of a lowered model (see lower_model.h): claiming requests, reading their
// header and prompt, prefix reuse, prefill, decode and finish, and the session blocks.
#include "compiler/lower_model_internal.h"

namespace blue::lower_model {

// The session store (LowerOptions::sessions): per layer a GLOBAL K and V store of `sessions`
// slots of ctx rows, a GLOBAL token table ((ctx + 1) words a slot: the count, then the tokens),
// and two blocks that copy KV rows between an instance's caches (or, paged, the pages its table
// maps) and a slot, taking the block arguments (rows = 1, slot, first row, end row).
void Lowering::sessionBlocks(CodeBuilder& cb, uint32_t ctx) {
    const uint32_t kv_dim = cfg.n_head_kv * cfg.head_dim;
    session_tokens = activation("session_tokens", BLUE_TC_GLOBAL, DType::I32, {uint64_t(ctx + 1) * sessions});
    for (uint32_t dir : {0u, 1u}) {
        uint32_t b = cb.beginBlock(prefix + (dir ? "session_save" : "session_load"), 4);
        for (uint32_t l = 0; l < cfg.n_layer; ++l) {
            for (const char* kv : {"k", "v"}) {
                const std::string ln = std::to_string(l);
                const uint32_t store = activation(std::string(kv) + "session." + ln, BLUE_TC_GLOBAL, kv_type,
                                                  {kv_dim, ctx, sessions});
                if (kv_page) {  // through the page table: the pages the request holds then
                    const uint32_t pool = ids.at(prefix + kv + "pool." + ln);
                    cb.tensor(Op::KVCOPYP, {pool, store, dir, 1, 2, 3, pageTableAddr(ctx), (ctx + kv_page - 1) / kv_page});
                } else {
                    const uint32_t cache = ids.at(prefix + kv + "cache." + ln);
                    cb.tensor(Op::KVCOPY, {cache, store, dir, 1, 2, 3});
                }
            }
        }
        cb.endBlock();
        (dir ? session_save : session_load) = b;
    }
}

// Jumps to `skip` unless the request continues a conversation its slot holds: no session, or a
// new one (BLUE_REQ_FLAG_SESSION_NEW: the slot holds another's or nothing).
void Lowering::unlessStored(CodeBuilder& cb, CodeBuilder::Label skip) {
    cb.jump(Op::BEQZ, {kSess}, skip);
    cb.op(Op::ANDI, {kWord, kFlags}, BLUE_REQ_FLAG_SESSION_NEW);
    cb.jump(Op::BNEZ, {kWord}, skip);
}

// A session request before prefix reuse: the slot's tokens become the history and its count the
// positions whose KV rows are valid, so INCMP finds what the prompt shares with the conversation.
// Not for a new session (nothing stored) or a request without one.
void Lowering::loadSession(CodeBuilder& cb, uint32_t ctx) {
    auto done = cb.newLabel("session_loaded"), copy = cb.newLabel("session_copy");
    unlessStored(cb, done);
    cb.op(Op::ADDI, {kN, kSess}, uint32_t(-1));
    cb.op(Op::MULI, {kN, kN}, ctx + 1);  // the slot's count word
    cb.op(Op::TLD, {kWord, kN}, session_tokens);
    cb.op(Op::MINU, {kWord, kWord, kCtx});
    cb.op(Op::ST, {kWord, 0}, kvValidAddr(ctx));
    cb.li(kI, 0);
    cb.bind(copy);
    cb.jump(Op::BGEU, {kI, kWord}, done);
    cb.op(Op::ADD, {kTok, kN, kI});
    cb.op(Op::ADDI, {kTok, kTok}, 1);
    cb.op(Op::TLD, {kTok, kTok}, session_tokens);
    cb.op(Op::ST, {kTok, kI}, BLUE_LM_HISTORY);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, copy);
    cb.bind(done);
}

// The slot's KV rows of positions [0, kReuse) into the instance's caches (or the pages its table
// maps), and a save writes from kReuse on (the rows before it are the slot's unchanged).
void Lowering::loadSessionRows(CodeBuilder& cb, uint32_t ctx) {
    cb.li(kArgRows, 1);
    cb.op(Op::ADDI, {kArgPos, kSess}, uint32_t(-1));  // block arguments: the slot, rows [0, kReuse)
    cb.li(kArgTokens, 0);
    cb.op(Op::MOV, {kArgSampling, kReuse});
    cb.op(Op::RUN, {kArgRows}, session_load);
    cb.op(Op::ST, {kReuse, 0}, sessionFromAddr(ctx));
}

// At a request's end: its tokens and KV rows from sessionFrom to kPos go into its slot, and the
// slot's count becomes kPos. Nothing without a session.
void Lowering::saveSession(CodeBuilder& cb, uint32_t ctx) {
    auto done = cb.newLabel("session_saved"), copy = cb.newLabel("session_save_tokens");
    auto copied = cb.newLabel("session_tokens_saved");
    cb.jump(Op::BEQZ, {kSess}, done);
    cb.op(Op::ADDI, {kArgPos, kSess}, uint32_t(-1));  // block argument 1: the slot
    cb.op(Op::MULI, {kN, kArgPos}, ctx + 1);
    cb.op(Op::TST, {kPos, kN}, session_tokens);
    cb.op(Op::LD, {kI, 0}, sessionFromAddr(ctx));
    cb.op(Op::MOV, {kArgTokens, kI});  // block argument 2: the first row
    cb.bind(copy);
    cb.jump(Op::BGEU, {kI, kPos}, copied);
    cb.op(Op::LD, {kTok, kI}, BLUE_LM_HISTORY);
    cb.op(Op::ADD, {kWord, kN, kI});
    cb.op(Op::ADDI, {kWord, kWord}, 1);
    cb.op(Op::TST, {kTok, kWord}, session_tokens);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, copy);
    cb.bind(copied);
    cb.li(kArgRows, 1);
    cb.op(Op::MOV, {kArgSampling, kPos});  // block argument 3: the end row
    cb.op(Op::RUN, {kArgRows}, session_save);
    cb.bind(done);
}

// Which idle instance takes the next request is decided here, on the GPU, by what the instances
// hold (INPEEK looks at the next message without taking it; INCMP compares its prompt with the
// instance's history, as prefix reuse does):
//   - an instance whose KV rows hold more than the prompt's first token takes it at once;
//   - an instance that holds nothing takes it one cycle after the message was first seen;
//   - an instance that holds another conversation, two cycles after.
// So a conversation's next turn goes to the instance that holds it, and a new one to an empty
// instance before it displaces anyone's rows. The first instance to see a message marks it (heap
// words: per input slot, the message's tag + 1 at kSeenTagHeap and the cycle in_slots words after).
// Several holders race; whichever claims first takes it. INRECV takes the next message, which may
// be another than the one looked at: the instance runs whatever it claims, so this choice moves
// work and never changes results. kSlot is the claimed slot after it.
// A paged program shares rows between instances through its prefix index (sharePrefix), so any
// instance takes the next request at once.
void Lowering::claimRequest(CodeBuilder& cb, uint32_t ctx, CodeBuilder::Label halt) {
    if (kv_page) {
        cb.op(Op::INRECV, {kSlot});
        cb.jump(Op::BEQ, {kSlot, kMinus1}, halt);
        return;
    }
    auto peek = cb.newLabel("peek_request"), waiting = cb.newLabel("request_waiting");
    auto seen = cb.newLabel("request_seen"), wait = cb.newLabel("request_wait");
    auto claim = cb.newLabel("claim_request");
    cb.bind(peek);
    cb.op(Op::INPEEK, {kSlot});
    cb.jump(Op::BEQ, {kSlot, kMinus1}, halt);
    cb.li(kWord, 0xFFFFFFFEu);
    cb.jump(Op::BNE, {kSlot, kWord}, waiting);
    cb.bind(wait);
    cb.op(Op::YIELD, {});
    cb.jump(Op::JMP, {}, peek);
    cb.bind(waiting);
    // The prompt starts after the header and the grammar section (its length word, then that
    // many words).
    cb.li(kTmp2, BLUE_REQ_HEADER);
    cb.op(Op::INLEN, {kTmp, kSlot});
    cb.jump(Op::BGEU, {kTmp2, kTmp}, claim);  // no grammar word: malformed, let the request reject it
    cb.op(Op::INLD, {kWord, kSlot, kTmp2});
    cb.op(Op::ADD, {kTmp2, kTmp2, kWord});
    cb.op(Op::ADDI, {kTmp2, kTmp2}, 1);
    cb.jump(Op::BLTU, {kTmp, kTmp2}, claim);
    cb.li(kReuse, BLUE_LM_HISTORY);
    cb.op(Op::INCMP, {kReuse, kSlot, kTmp2});
    cb.op(Op::LD, {kWord, 0}, kvValidAddr(ctx));
    cb.op(Op::MINU, {kReuse, kReuse, kWord});
    cb.li(kWord, 2);
    cb.jump(Op::BGEU, {kReuse, kWord}, claim);  // holds more of it than the first token
    cb.li(kTmp, BLUE_REQ_TAG);
    cb.op(Op::INLD, {kTag, kSlot, kTmp});
    cb.op(Op::ADDI, {kTag, kTag}, 1);
    cb.op(Op::LDG, {kWord, kSlot}, kSeenTagHeap);
    cb.jump(Op::BEQ, {kWord, kTag}, seen);
    cb.op(Op::STG, {kTag, kSlot}, kSeenTagHeap);  // the first to see it
    cb.op(Op::CYCLE, {kWord});
    cb.op(Op::STG, {kWord, kSlot}, kSeenTagHeap + m.layout.in_slots);
    cb.jump(Op::JMP, {}, wait);
    cb.bind(seen);
    cb.op(Op::CYCLE, {kTmp});
    cb.op(Op::LDG, {kWord, kSlot}, kSeenTagHeap + m.layout.in_slots);
    cb.op(Op::SUB, {kTmp, kTmp, kWord});  // cycles since it was first seen
    cb.op(Op::LD, {kWord, 0}, kvValidAddr(ctx));
    cb.op(Op::SEQI, {kN, kWord}, 0);  // 1: this instance holds nothing
    cb.li(kWord, 2);
    cb.op(Op::SUB, {kN, kWord, kN});  // cycles to wait: 1 when empty, else 2
    cb.jump(Op::BLTU, {kTmp, kN}, wait);
    cb.bind(claim);
    cb.op(Op::INRECV, {kSlot});
    cb.jump(Op::BEQ, {kSlot, kMinus1}, halt);
}


// The generation program: each instance loops taking a request, prefilling its prompt in chunks and
// decoding until a stop, then takes the next; it halts once input is closed and drained.
void Lowering::generationProgram(CodeBuilder& cb, uint32_t block, uint32_t ctx, uint32_t chunk) {
    GenLabels g;
    g.next = cb.newLabel("next_request"), g.halt = cb.newLabel("halt");
    g.copy_params = cb.newLabel("copy_params"), g.copy_stop = cb.newLabel("copy_stop");
    g.prefill = cb.newLabel("prefill"), g.gen = cb.newLabel("generate");
    g.finish = cb.newLabel("finish"), g.chunk_ok = cb.newLabel("chunk_ok");
    g.eog_loop = cb.newLabel("eog_loop"), g.stop_loop = cb.newLabel("stop_loop");
    g.emit = cb.newLabel("emit"), g.reject = cb.newLabel("reject");

    // End-of-generation tokens of the model, in the constant pool: {count, ids...}.
    std::vector<uint32_t> eog = endOfGenerationTokens(gguf, cfg);
    uint32_t eog_at = uint32_t(m.consts.size());
    m.consts.push_back(uint32_t(eog.size()));
    m.consts.insert(m.consts.end(), eog.begin(), eog.end());
    // The loop's LDK names eog_at + 1 even when the count is 0 (a file without end tokens): the
    // verifier checks that offset against the pool, so it must exist (never read then).
    if (eog.empty()) m.consts.push_back(0);
    m.syms.push_back({SymKind::CONST, eog_at, "eog_tokens"});

    cb.li(kMinus1, 0xFFFFFFFFu);
    cb.li(kCtx, ctx);
    cb.op(Op::IID, {kIid});
    if (kv_page) {
        cb.li(kOne, 1);
        cb.li(kHeld, 0);
        cb.li(kLeft, 0);
        cb.li(kEight, 8);
        cb.li(kPubEnd, 0);
        cb.li(kReady, 0);
    }
    cb.bind(g.next);
    claimRequest(cb, ctx, g.halt);
    requestParams(cb, ctx, g);
    promptSection(cb, g);
    if (kv_page) {
        admitPages(cb, ctx, g);
        sharePrefix(cb, ctx);
    } else {
        prefixReuse(cb, ctx);
    }
    prefill(cb, block, ctx, chunk, g);
    decode(cb, block, ctx, eog_at, g);
    finishRequest(cb, ctx, g);
}

// The request's header: its tag (the response begins), limits, flags, session, log-probability
// and sampling parameters, and stop tokens. Rejects an embedding request without an embed block
// and a session beyond the program's slots.
void Lowering::requestParams(CodeBuilder& cb, uint32_t ctx, const GenLabels& g) {
    cb.li(kTmp, BLUE_REQ_TAG);
    cb.op(Op::INLD, {kTag, kSlot, kTmp});
    cb.op(Op::OUTBEGIN, {kTag});
    cb.op(Op::ADDI, {kCancelMark, kTag}, 1);  // the host sets this instance's flag to tag + 1 to cancel
    cb.li(kTmp, BLUE_REQ_MAX_NEW);
    cb.op(Op::INLD, {kMaxNew, kSlot, kTmp});
    cb.li(kTmp, BLUE_REQ_FLAGS);
    cb.op(Op::INLD, {kFlags, kSlot, kTmp});  // all flags until prefix reuse read its own
    // An embedding request runs the embed block and emits the pooled vector; a program lowered
    // without one rejects it.
    cb.op(Op::ANDI, {kEmbed, kFlags}, BLUE_REQ_FLAG_EMBED);
    if (embed_block == kNone) cb.jump(Op::BNEZ, {kEmbed}, g.reject);
    // A session (1 + its slot): none beyond the program's slots.
    cb.li(kTmp, BLUE_REQ_SESSION);
    cb.op(Op::INLD, {kSess, kSlot, kTmp});
    cb.li(kWord, sessions + 1);
    cb.jump(Op::BGEU, {kSess, kWord}, g.reject);
    if (sessions) {  // a save writes from here on; loading a stored conversation moves it
        cb.li(kWord, 0);
        cb.op(Op::ST, {kWord, 0}, sessionFromAddr(ctx));
    }
    // Log-probabilities: kLp = 0 (none) or 1 + N alternatives, which SAMPLE writes when N > 0.
    cb.li(kTmp, BLUE_REQ_LOGPROBS);
    cb.op(Op::INLD, {kLp, kSlot, kTmp});
    cb.li(kTmp, BLUE_MAX_TOP_LOGPROBS + 1);
    cb.op(Op::MINU, {kLp, kLp, kTmp});
    cb.op(Op::ADDI, {kWord, kLp}, uint32_t(-1));
    cb.op(Op::MINU, {kWord, kWord, kLp});  // kLp - 1, or 0 when kLp is 0
    cb.op(Op::ST, {kWord, 0}, BLUE_LM_SAMPLING + BLUE_SP_TOP_N);
    cb.li(kWord, topLogprobsAddr(ctx));
    cb.op(Op::ST, {kWord, 0}, BLUE_LM_SAMPLING + BLUE_SP_TOP_ADDR);
    // Sampling parameters: request words TEMP..SEED map in order onto SP_TEMP..SP_SEED.
    cb.li(kI, 0);
    cb.li(kN, BLUE_SP_SEED + 1);
    cb.bind(g.copy_params);
    cb.op(Op::ADDI, {kTmp, kI}, BLUE_REQ_TEMP);
    cb.op(Op::INLD, {kWord, kSlot, kTmp});
    cb.op(Op::ST, {kWord, kI}, BLUE_LM_SAMPLING + BLUE_SP_TEMP);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::BLTU, {kI, kN}, g.copy_params);
    // Stop tokens of the request: the count (clamped) and all slots.
    cb.li(kTmp, BLUE_REQ_N_STOP);
    cb.op(Op::INLD, {kWord, kSlot, kTmp});
    cb.li(kTmp, BLUE_REQ_MAX_STOP);
    cb.op(Op::MINU, {kNStop, kWord, kTmp});
    cb.li(kI, 0);
    cb.bind(g.copy_stop);
    cb.op(Op::ADDI, {kTmp, kI}, BLUE_REQ_STOP);
    cb.op(Op::INLD, {kWord, kSlot, kTmp});
    cb.op(Op::ST, {kWord, kI}, BLUE_LM_STOP);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.li(kN, BLUE_REQ_MAX_STOP);
    cb.jump(Op::BLTU, {kI, kN}, g.copy_stop);
}

// The start position and the grammar section; kTmp2 = where the prompt starts in the message and
// kTmp = the prompt's length. Rejects what does not fit the context.
void Lowering::promptSection(CodeBuilder& cb, const GenLabels& g) {
    // The prompt goes into the history at its start position (the positions before it are a
    // restored conversation: history and KV rows the host wrote); one that does not fit is
    // rejected.
    cb.li(kTmp, BLUE_REQ_START);
    cb.op(Op::INLD, {kStart, kSlot, kTmp});
    cb.jump(Op::BGEU, {kStart, kCtx}, g.reject);
    // The grammar section (its length, then the automaton) goes into the instance's grammar
    // tensor, which starts empty (no grammar); kTmp2 = where the prompt starts. A program
    // lowered without grammars skips the (empty) section.
    cb.li(kTmp2, BLUE_REQ_HEADER);
    if (grammar != kNone) {
        // A large automaton is copied in a cycle of its own, at its start: lavapipe ends every
        // loop of a sequencer invocation after 65,535 iterations in all (one 8-lane group), and
        // INTCPY takes one word an iteration. Instances that resume at the copy all run it in the
        // same round of slow instructions, so their copies overlap instead of adding up, and the
        // prompt's comparisons wait for the next cycle. The host keeps an automaton under the
        // limit on such devices (maxGrammarWords).
        auto copy_grammar = cb.newLabel("copy_grammar");
        cb.op(Op::INLD, {kWord, kSlot, kTmp2});
        cb.li(kTmp, kGrammarCopyAlone);
        cb.op(Op::SLTU, {kN, kTmp, kWord});  // 1: copied in a cycle of its own
        cb.jump(Op::BEQZ, {kN}, copy_grammar);
        cb.op(Op::YIELD, {});
        cb.bind(copy_grammar);
        cb.li(kWord, 0);
        cb.li(kTmp, BLUE_GR_STATES);
        cb.op(Op::TST, {kWord, kTmp}, grammar);
        cb.op(Op::INTCPY, {kTmp2, kSlot}, grammar);
        auto copied = cb.newLabel("grammar_copied");
        cb.jump(Op::BEQZ, {kN}, copied);
        cb.op(Op::YIELD, {});
        cb.bind(copied);
    } else {
        cb.op(Op::INLD, {kWord, kSlot, kTmp2});
        cb.jump(Op::BNEZ, {kWord}, g.reject);
        cb.op(Op::ADDI, {kTmp2, kTmp2}, 1);
    }
    cb.op(Op::INLEN, {kTmp, kSlot});
    cb.op(Op::SUB, {kTmp, kTmp, kTmp2});
    cb.jump(Op::BGEU, {kTmp, kCtx}, g.reject);
    cb.op(Op::ADD, {kTmp, kTmp, kStart});
    cb.jump(Op::BGEU, {kTmp, kCtx}, g.reject);
}

// kReuse = leading prompt tokens whose KV rows the instance holds (prefix reuse), reported with
// OUTU when some; kHist = the history's address.
void Lowering::prefixReuse(CodeBuilder& cb, uint32_t ctx) {
    cb.li(kHist, BLUE_LM_HISTORY);
    // Prefix reuse: the KV rows of the positions the instance processed last stay valid for the
    // leading prompt tokens that equal its history there, so prefill starts after them (at most
    // at the last prompt token, whose logits give the first sample). Not for a restored
    // conversation (the host wrote what precedes the start) or when the request opts out.
    auto no_reuse = cb.newLabel("no_reuse");
    cb.li(kReuse, 0);
    cb.jump(Op::BNEZ, {kStart}, no_reuse);
    cb.op(Op::ANDI, {kWord, kFlags}, BLUE_REQ_FLAG_NO_PREFIX);
    cb.jump(Op::BNEZ, {kWord}, no_reuse);
    // Mean and first-token pooling need every prompt row computed in this request.
    if (pooling == Pooling::Mean || pooling == Pooling::Cls) cb.jump(Op::BNEZ, {kEmbed}, no_reuse);
    if (sessions) loadSession(cb, ctx);
    cb.li(kReuse, BLUE_LM_HISTORY);
    cb.op(Op::INCMP, {kReuse, kSlot, kTmp2});
    cb.op(Op::LD, {kWord, 0}, kvValidAddr(ctx));
    cb.op(Op::MINU, {kReuse, kReuse, kWord});
    cb.op(Op::ADDI, {kWord, kTmp}, uint32_t(-1));  // kTmp: prompt length (start is 0)
    cb.op(Op::MINU, {kReuse, kReuse, kWord});       // no prompt: -1, and kReuse is 0 already
    cb.jump(Op::BEQZ, {kReuse}, no_reuse);
    cb.op(Op::OUTU, {kReuse});
    if (sessions) {  // the shared rows of a stored conversation come from its slot
        auto own = cb.newLabel("own_rows");
        unlessStored(cb, own);
        loadSessionRows(cb, ctx);
        cb.bind(own);
    }
    cb.bind(no_reuse);
}

// The prompt goes into the history and is prefilled in chunks; an embedding request then emits
// its pooled vector and ends.
void Lowering::prefill(CodeBuilder& cb, uint32_t block, uint32_t ctx, uint32_t chunk, const GenLabels& g) {
    cb.op(Op::ANDI, {kFlags, kFlags}, BLUE_REQ_FLAG_IGNORE_EOG);
    cb.op(Op::ADD, {kPos, kStart, kReuse});  // one of them is 0
    if (!kv_page) {  // a paged program copied the prompt before its prefix lookup
        cb.op(Op::ADD, {kPrompt, kHist, kStart});
        cb.op(Op::INCPY, {kPrompt, kSlot, kTmp2});  // kPrompt = prompt length
        cb.op(Op::INFREE, {kSlot});
    }
    cb.jump(Op::BEQZ, {kPrompt}, g.finish);
    cb.op(Op::ADD, {kPrompt, kPrompt, kStart});  // kPrompt = the position after the prompt
    cb.op(Op::ST, {kHist, 0}, BLUE_LM_SAMPLING + BLUE_SP_HIST_ADDR);
    cb.li(kChunk, chunk);
    cb.li(kArgSampling, BLUE_LM_SAMPLING);
    // Prefill in chunks; every chunk samples, the last chunk's sample is the first token.
    cb.bind(g.prefill);
    cb.op(Op::SUB, {kArgRows, kPrompt, kPos});
    cb.jump(Op::BLTU, {kArgRows, kChunk}, g.chunk_ok);
    cb.op(Op::MOV, {kArgRows, kChunk});
    cb.bind(g.chunk_ok);
    cb.op(Op::MOV, {kArgPos, kPos});
    cb.op(Op::ADD, {kArgTokens, kHist, kPos});
    cb.op(Op::ADD, {kPos, kPos, kArgRows});
    cb.op(Op::ST, {kPos, 0}, BLUE_LM_SAMPLING + BLUE_SP_HIST_LEN);
    // The RNG counter is the position of the token being sampled, so a seed draws the same
    // numbers however the sequence was split into chunks, requests or restored snapshots.
    cb.op(Op::ST, {kPos, 0}, BLUE_LM_SAMPLING + BLUE_SP_COUNTER);
    if (kv_page) ensurePages(cb, ctx, g);
    if (embed_block != kNone) {
        auto run_embed = cb.newLabel("run_embed"), ran = cb.newLabel("ran");
        cb.jump(Op::BNEZ, {kEmbed}, run_embed);
        cb.op(Op::RUN, {kArgRows}, block);
        cb.jump(Op::JMP, {}, ran);
        cb.bind(run_embed);
        cb.op(Op::RUN, {kArgRows}, embed_block);
        cb.bind(ran);
    } else {
        cb.op(Op::RUN, {kArgRows}, block);
    }
    if (kv_page) markReady(cb, ctx);
    cb.jump(Op::BLTU, {kPos, kPrompt}, g.prefill);
    if (embed_block != kNone) {  // the pooled vector, one OUTF per element, ends the request
        auto embedded = cb.newLabel("generate_or_embed"), emit_pooled = cb.newLabel("emit_pooled");
        cb.jump(Op::BEQZ, {kEmbed}, embedded);
        cb.li(kI, 0);
        cb.li(kN, cfg.n_embd);
        cb.bind(emit_pooled);
        cb.op(Op::TLD, {kWord, kI}, pooled);
        cb.op(Op::OUTF, {kWord});
        cb.op(Op::ADDI, {kI, kI}, 1);
        cb.jump(Op::BLTU, {kI, kN}, emit_pooled);
        cb.jump(Op::JMP, {}, g.finish);
        cb.bind(embedded);
    }
    cb.li(kGenerated, 0);
}

// Decode: check the sampled token, emit it, feed it back, until a stop, the length limit, the
// context's end or a cancel.
void Lowering::decode(CodeBuilder& cb, uint32_t block, uint32_t ctx, uint32_t eog_at, const GenLabels& g) {
    // Decode: check the sampled token, emit it, feed it back.
    cb.bind(g.gen);
    cb.jump(Op::BGEU, {kGenerated, kMaxNew}, g.finish);
    cb.op(Op::LD, {kTok, 0}, BLUE_LM_SAMPLING + BLUE_SP_OUT_TOKEN);
    cb.jump(Op::BNEZ, {kFlags}, g.stop_loop);
    cb.li(kI, 0);
    cb.li(kTmp2, 0);
    cb.op(Op::LDK, {kN, kTmp2}, eog_at);
    cb.bind(g.eog_loop);
    cb.jump(Op::BGEU, {kI, kN}, g.stop_loop);
    cb.op(Op::LDK, {kWord, kI}, eog_at + 1);
    cb.jump(Op::BEQ, {kTok, kWord}, g.finish);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, g.eog_loop);
    cb.bind(g.stop_loop);
    cb.li(kI, 0);
    auto stop_next = cb.newLabel("stop_next");
    cb.bind(stop_next);
    cb.jump(Op::BGEU, {kI, kNStop}, g.emit);
    cb.op(Op::LD, {kWord, kI}, BLUE_LM_STOP);
    cb.jump(Op::BEQ, {kTok, kWord}, g.finish);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, stop_next);
    // Asked for: the token's log-probability and its alternatives' go out ahead of it.
    auto emit_token = cb.newLabel("emit_token"), emit_top = cb.newLabel("emit_top");
    cb.bind(g.emit);
    cb.jump(Op::BEQZ, {kLp}, emit_token);
    cb.op(Op::LD, {kWord, 0}, BLUE_LM_SAMPLING + BLUE_SP_OUT_LOGPROB);
    cb.op(Op::OUTF, {kWord});
    cb.li(kI, 0);
    cb.op(Op::ADDI, {kN, kLp}, uint32_t(-1));
    cb.bind(emit_top);
    cb.jump(Op::BGEU, {kI, kN}, emit_token);
    cb.op(Op::ADD, {kTmp, kI, kI});
    cb.op(Op::LD, {kWord, kTmp}, topLogprobsAddr(ctx));
    cb.op(Op::OUT, {kWord});
    cb.op(Op::LD, {kWord, kTmp}, topLogprobsAddr(ctx) + 1);
    cb.op(Op::OUTF, {kWord});
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, emit_top);
    cb.bind(emit_token);
    cb.op(Op::OUTT, {kTok});
    if (grammar != kNone) {  // the automaton takes the emitted token at the next sample
        cb.op(Op::ADDI, {kWord, kTok}, 1);
        cb.li(kTmp, BLUE_GR_PENDING);
        cb.op(Op::TST, {kWord, kTmp}, grammar);
    }
    cb.op(Op::ADDI, {kGenerated, kGenerated}, 1);
    cb.op(Op::INFLAG, {kFlagWord, kIid});
    cb.jump(Op::BEQ, {kFlagWord, kCancelMark}, g.finish);
    cb.jump(Op::BGEU, {kPos, kCtx}, g.finish);
    cb.op(Op::ST, {kTok, kPos}, BLUE_LM_HISTORY);
    cb.li(kArgRows, 1);
    cb.op(Op::MOV, {kArgPos, kPos});
    cb.op(Op::ADD, {kArgTokens, kHist, kPos});
    cb.op(Op::ADDI, {kPos, kPos}, 1);
    cb.op(Op::ST, {kPos, 0}, BLUE_LM_SAMPLING + BLUE_SP_HIST_LEN);
    cb.op(Op::ST, {kPos, 0}, BLUE_LM_SAMPLING + BLUE_SP_COUNTER);
    if (kv_page) ensurePages(cb, ctx, g);
    cb.op(Op::RUN, {kArgRows}, block);
    cb.jump(Op::JMP, {}, g.gen);
}

// Rejected or finished: the response ends and the instance takes the next request; halt after.
void Lowering::finishRequest(CodeBuilder& cb, uint32_t ctx, const GenLabels& g) {
    cb.bind(g.reject);
    cb.op(Op::INFREE, {kSlot});
    cb.li(kSess, 0);  // a rejected request saves nothing into a session
    cb.bind(g.finish);
    // The positions before kPos hold KV rows of the history's tokens: what the next request may
    // reuse. (A rejected request leaves kPos as the last request ended it.)
    if (kv_page) {
        publishAnswer(cb, ctx);
    } else {
        cb.op(Op::ST, {kPos, 0}, kvValidAddr(ctx));
    }
    if (sessions) saveSession(cb, ctx);
    cb.op(Op::OUTEND, {kTag});
    if (kv_page) {  // the answer's pages are ready a cycle after their keys; then all are let go
        auto none = cb.newLabel("kv_answer_none");
        cb.jump(Op::BGEU, {kReady, kPubEnd}, none);
        cb.op(Op::YIELD, {});
        markReady(cb, ctx);
        cb.bind(none);
        releasePages(cb, ctx);
    }
    cb.jump(Op::JMP, {}, g.next);
    cb.bind(g.halt);
    cb.op(Op::HALT);
}

}  // namespace blue::lower_model
