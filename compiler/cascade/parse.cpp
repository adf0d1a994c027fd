// The cascade language's lexer and parser (the grammar is in cascade.h). Syntax errors name
// FILE:LINE:COL; names and sizes are checked later, against the models (lower.cpp).
#include <cmath>
#include <cstdlib>
#include <set>

#include "compiler/cascade/cascade.h"
#include "vm/kernel_abi.h"
#include "vm/llm_abi.h"

namespace blue {

namespace {

using namespace cascade;

struct Tok {
    enum Kind { IDENT, NUMBER, STRING, SYMBOL, NEWLINE, END } kind = END;
    std::string text;  // identifier, symbol, unescaped string, or the number as written
    double number = 0;
    bool integer = false;
    Loc loc;
};

// Bounds that keep a hostile source from building huge programs.
constexpr uint32_t kMaxNesting = 16;
constexpr uint32_t kMaxRepeat = 1000;
constexpr uint32_t kMaxStages = 256;
constexpr size_t kMaxSource = 1 << 20;

class Parser {
public:
    Parser(std::string_view src, const std::string& file) : src_(src), file_(file) {}

    Result<Program> parse() {
        if (src_.size() > kMaxSource) return BLUE_ERROR("%s: source is %zu bytes, more than 1 MiB", file_.c_str(), src_.size());
        BLUE_TRY(lex());
        Program p;
        p.file = file_;
        prog_ = &p;
        while (peek().kind != Tok::END) {
            if (peek().kind == Tok::NEWLINE) { ++pos_; continue; }
            BLUE_TRY(topLevel(p));
        }
        return p;
    }

private:
    std::string_view src_;
    std::string file_;
    std::vector<Tok> toks_;
    size_t pos_ = 0;
    Program* prog_ = nullptr;
    uint32_t depth_ = 0, loop_depth_ = 0;

    Status errorAt(Loc l, const std::string& msg) const {
        return BLUE_ERROR("%s:%u:%u: %s", file_.c_str(), l.line, l.col, msg.c_str());
    }

    static std::string describe(const Tok& t) {
        switch (t.kind) {
            case Tok::IDENT: return "'" + t.text + "'";
            case Tok::NUMBER: return "number " + t.text;
            case Tok::STRING: return "a string";
            case Tok::SYMBOL: return "'" + t.text + "'";
            case Tok::NEWLINE: return "end of line";
            case Tok::END: return "end of file";
        }
        return "?";
    }

    // ---- lexer ----
    bool digitAt(size_t i) const { return i < src_.size() && std::isdigit(uint8_t(src_[i])); }
    bool startsNumber(size_t i) const {
        char c = src_[i];
        if (std::isdigit(uint8_t(c))) return true;
        if (c == '-') return digitAt(i + 1) || (i + 2 < src_.size() && src_[i + 1] == '.' && digitAt(i + 2));
        return c == '.' && digitAt(i + 1);
    }
    Status lex() {
        uint32_t line = 1, col = 1;
        size_t i = 0;
        auto advance = [&](size_t n) {
            for (size_t k = 0; k < n; ++k, ++i) {
                if (src_[i] == '\n') { ++line; col = 1; } else { ++col; }
            }
        };
        while (i < src_.size()) {
            char c = src_[i];
            Loc loc{line, col};
            if (c == '#') {
                while (i < src_.size() && src_[i] != '\n') advance(1);
            } else if (c == '\n') {
                toks_.push_back({Tok::NEWLINE, "", 0, false, loc});
                advance(1);
            } else if (c == ' ' || c == '\t' || c == '\r') {
                advance(1);
            } else if (std::isalpha(uint8_t(c)) || c == '_') {
                size_t j = i;
                while (j < src_.size() && (std::isalnum(uint8_t(src_[j])) || src_[j] == '_')) ++j;
                toks_.push_back({Tok::IDENT, std::string(src_.substr(i, j - i)), 0, false, loc});
                advance(j - i);
            } else if (startsNumber(i)) {
                size_t j = i + (c == '-');
                bool integer = true;
                while (j < src_.size() && (std::isdigit(uint8_t(src_[j])) || src_[j] == '.' ||
                                           src_[j] == 'e' || src_[j] == 'E' ||
                                           ((src_[j] == '-' || src_[j] == '+') && (src_[j - 1] == 'e' || src_[j - 1] == 'E')))) {
                    if (!std::isdigit(uint8_t(src_[j]))) integer = false;
                    ++j;
                }
                std::string text(src_.substr(i, j - i));
                char* end = nullptr;
                double v = std::strtod(text.c_str(), &end);
                if (!end || *end || !std::isfinite(v)) return errorAt(loc, "'" + text + "' is not a number");
                toks_.push_back({Tok::NUMBER, text, v, integer, loc});
                advance(j - i);
            } else if (c == '"') {
                std::string s;
                advance(1);
                for (;;) {
                    if (i >= src_.size() || src_[i] == '\n') return errorAt(loc, "string not closed on its line");
                    char d = src_[i];
                    if (d == '"') { advance(1); break; }
                    if (d != '\\') { s += d; advance(1); continue; }
                    Loc esc{line, col};
                    if (i + 1 >= src_.size()) return errorAt(esc, "string not closed on its line");
                    char e = src_[i + 1];
                    advance(2);
                    switch (e) {
                        case 'n': s += '\n'; break;
                        case 't': s += '\t'; break;
                        case '"': s += '"'; break;
                        case '\\': s += '\\'; break;
                        default: return errorAt(esc, std::string("unknown escape '\\") + e + "' (use \\n, \\t, \\\" or \\\\)");
                    }
                }
                toks_.push_back({Tok::STRING, s, 0, false, loc});
            } else {
                static const char* two[] = {"<=", ">=", "==", "!="};
                std::string sym;
                for (const char* t : two) {
                    if (src_.substr(i, 2) == t) sym = t;
                }
                if (sym.empty() && std::string("{}[]()=+,.<>").find(c) != std::string::npos) sym = std::string(1, c);
                if (sym.empty()) {
                    if (uint8_t(c) < 0x20 || uint8_t(c) >= 0x7F) return errorAt(loc, strFormat("unexpected byte 0x%02x", unsigned(uint8_t(c))));
                    return errorAt(loc, std::string("unexpected character '") + c + "'");
                }
                toks_.push_back({Tok::SYMBOL, sym, 0, false, loc});
                advance(sym.size());
            }
        }
        toks_.push_back({Tok::NEWLINE, "", 0, false, {line, col}});
        toks_.push_back({Tok::END, "", 0, false, {line, col}});
        return Status::ok();
    }

    // ---- helpers ----
    const Tok& peek(size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
    const Tok& next() { const Tok& t = peek(); if (pos_ < toks_.size() - 1) ++pos_; return t; }
    bool isSym(const char* s, size_t ahead = 0) const { return peek(ahead).kind == Tok::SYMBOL && peek(ahead).text == s; }
    bool isWord(const char* s) const { return peek().kind == Tok::IDENT && peek().text == s; }

    Status expectSym(const char* s, const char* what) {
        if (!isSym(s)) return errorAt(peek().loc, std::string("expected '") + s + "' " + what + ", found " + describe(peek()));
        ++pos_;
        return Status::ok();
    }
    Status endOfLine() {
        if (peek().kind != Tok::NEWLINE) return errorAt(peek().loc, "expected end of line, found " + describe(peek()));
        while (peek().kind == Tok::NEWLINE) ++pos_;
        return Status::ok();
    }
    Result<std::string> ident(const char* what) {
        if (peek().kind != Tok::IDENT) return errorAt(peek().loc, std::string("expected ") + what + ", found " + describe(peek()));
        return next().text;
    }
    Result<double> number(const char* what) {
        if (peek().kind != Tok::NUMBER) return errorAt(peek().loc, std::string("expected ") + what + ", found " + describe(peek()));
        return next().number;
    }
    Result<uint32_t> count(const char* what, uint32_t lo, uint32_t hi) {
        Loc l = peek().loc;
        if (peek().kind != Tok::NUMBER || !peek().integer) return errorAt(l, std::string("expected ") + what + " (a whole number), found " + describe(peek()));
        double v = next().number;
        if (v < lo || v > hi) return errorAt(l, strFormat("%s must be between %u and %u", what, lo, hi));
        return uint32_t(v);
    }
    Result<float> real(const char* what, double lo, double hi) {
        Loc l = peek().loc;
        BLUE_TRY_ASSIGN(double v, number(what));
        if (v < lo || v > hi) return errorAt(l, strFormat("%s must be between %g and %g", what, lo, hi));
        return float(v);
    }
    Result<std::string> string(const char* what) {
        if (peek().kind != Tok::STRING) return errorAt(peek().loc, std::string("expected ") + what + " (a quoted string), found " + describe(peek()));
        return next().text;
    }
    Status checkName(const std::string& name, Loc l) {
        static const std::set<std::string> reserved = {
            "model", "slot", "stage", "prompt", "write", "append", "max_tokens", "temperature", "top_k",
            "top_p", "min_p", "repeat_penalty", "repeat_last_n", "stop", "skip", "if", "else", "repeat",
            "break", "run", "output", "budget", "context", "and", "or", "not", "contains", "speculate",
            "speculate_tokens", "select", "prefer", "fork", "join"};
        if (reserved.count(name)) return errorAt(l, "'" + name + "' is a keyword and cannot name a model, slot or stage");
        if (name == "kernel" || name == "score" || name == "filter") return errorAt(l, "'" + name + "' is a keyword and cannot name a model, slot, stage or kernel");
        if (name.size() > 64) return errorAt(l, "name longer than 64 characters");
        return Status::ok();
    }
    Status unique(const std::string& name, Loc l) {
        BLUE_TRY(checkName(name, l));
        for (const auto& m : prog_->models) if (m.name == name) return errorAt(l, "'" + name + "' is already a model (line " + std::to_string(m.loc.line) + ")");
        for (const auto& s : prog_->slots) if (s.name == name) return errorAt(l, "'" + name + "' is already a slot (line " + std::to_string(s.loc.line) + ")");
        for (const auto& s : prog_->stages) if (s.name == name) return errorAt(l, "'" + name + "' is already a stage (line " + std::to_string(s.loc.line) + ")");
        for (const auto& k : prog_->kernels) if (k.name == name) return errorAt(l, "'" + name + "' is already a kernel (line " + std::to_string(k.loc.line) + ")");
        if (name == "input") return errorAt(l, "'input' is the task's slot; declare its capacity with `slot input[N]`");
        return Status::ok();
    }

    // ---- statements ----
    Status topLevel(Program& p) {
        const Tok& t = peek();
        if (t.kind != Tok::IDENT) return errorAt(t.loc, "expected a statement (model, slot, stage, run, if, repeat, budget, context, output, prefer), found " + describe(t));
        Loc l = t.loc;
        if (t.text == "model") {
            ++pos_;
            ModelDecl m;
            m.loc = peek().loc;
            BLUE_TRY_ASSIGN(m.name, ident("a model name"));
            BLUE_TRY(unique(m.name, m.loc));
            BLUE_TRY(expectSym("=", "after the model's name"));
            m.path_loc = peek().loc;
            BLUE_TRY_ASSIGN(m.path, string("the model's GGUF path"));
            if (m.path.empty()) return errorAt(m.path_loc, "empty model path");
            if (p.models.size() >= 8) return errorAt(l, "more than 8 models");
            p.models.push_back(std::move(m));
            return endOfLine();
        }
        if (t.text == "slot") {
            ++pos_;
            SlotDecl s;
            s.loc = peek().loc;
            BLUE_TRY_ASSIGN(s.name, ident("a slot name"));
            BLUE_TRY(expectSym("[", "before the slot's capacity"));
            BLUE_TRY_ASSIGN(s.capacity, count("a slot's capacity in tokens", 1, 65536));
            BLUE_TRY(expectSym("]", "after the slot's capacity"));
            if (s.name == "input") {
                if (p.input_loc.line) return errorAt(s.loc, "the input slot is declared twice");
                p.input_capacity = s.capacity;
                p.input_loc = s.loc;
            } else {
                BLUE_TRY(unique(s.name, s.loc));
                if (p.slots.size() >= 64) return errorAt(l, "more than 64 slots");
                p.slots.push_back(std::move(s));
            }
            return endOfLine();
        }
        if (t.text == "budget" || t.text == "context") {
            bool budget = t.text == "budget";
            ++pos_;
            uint32_t& field = budget ? p.budget : p.context;
            if (field) return errorAt(l, "'" + t.text + "' is given twice");
            BLUE_TRY_ASSIGN(field, count(budget ? "the token budget" : "the context length", budget ? 1 : 16, budget ? 1u << 24 : 32768));
            return endOfLine();
        }
        if (t.text == "output") {
            ++pos_;
            if (!p.outputs.empty()) return errorAt(l, "'output' is given twice");
            for (;;) {
                p.output_locs.push_back(peek().loc);
                BLUE_TRY_ASSIGN(std::string name, ident("a slot name"));
                p.outputs.push_back(name);
                if (!isSym(",")) break;
                ++pos_;
            }
            return endOfLine();
        }
        if (t.text == "prefer") return prefer(p);
        if (t.text == "kernel") return kernelDecl(p);
        Stmt s;
        BLUE_TRY(statement(&s));
        p.body.push_back(std::move(s));
        return Status::ok();
    }

    // `kernel NAME = "PATH"`: a custom kernel (GLSL .comp or SPIR-V .spv; loaded in lower.cpp).
    Status kernelDecl(Program& p) {
        Loc l = peek().loc;
        ++pos_;
        KernelUse k;
        k.loc = peek().loc;
        BLUE_TRY_ASSIGN(k.name, ident("a kernel name"));
        BLUE_TRY(unique(k.name, k.loc));
        BLUE_TRY(expectSym("=", "after the kernel's name"));
        k.path_loc = peek().loc;
        BLUE_TRY_ASSIGN(k.path, string("the kernel's file (.comp GLSL or .spv SPIR-V)"));
        if (k.path.empty()) return errorAt(k.path_loc, "empty kernel path");
        if (p.kernels.size() >= BLUE_KERNEL_MAX_COUNT) return errorAt(l, strFormat("more than %u kernels", BLUE_KERNEL_MAX_COUNT));
        p.kernels.push_back(std::move(k));
        return endOfLine();
    }

    // `score KERNEL over SLOT [param N | param "text"]`: runs a custom kernel over a slot's tokens;
    // `filter SLOT with KERNEL into TARGET [param ...]` also writes the kernel's slot into TARGET.
    Status scoreStmt(Stmt* s) {
        bool filter = peek().text == "filter";
        ++pos_;
        s->kind = Stmt::SCORE;
        if (filter) {
            s->score_slot_loc = peek().loc;
            BLUE_TRY_ASSIGN(s->score_slot, ident("a slot name"));
            if (!isWord("with")) return errorAt(peek().loc, "expected 'with' and a kernel after the slot, found " + describe(peek()));
            ++pos_;
        }
        Loc kl = peek().loc;
        BLUE_TRY_ASSIGN(std::string name, ident("a kernel name"));
        bool found = false;
        for (size_t i = 0; i < prog_->kernels.size(); ++i) {
            if (prog_->kernels[i].name == name) { s->kernel = uint32_t(i); found = true; }
        }
        if (!found) return errorAt(kl, "no kernel '" + name + "' is declared before this line (`kernel NAME = \"FILE.comp\"`)");
        if (filter) {
            if (!isWord("into")) return errorAt(peek().loc, "expected 'into' and the slot to write after the kernel, found " + describe(peek()));
            ++pos_;
            s->score_into_loc = peek().loc;
            BLUE_TRY_ASSIGN(s->score_into, ident("the slot to write"));
        } else {
            if (!isWord("over")) return errorAt(peek().loc, "expected 'over' and a slot after the kernel, found " + describe(peek()));
            ++pos_;
            s->score_slot_loc = peek().loc;
            BLUE_TRY_ASSIGN(s->score_slot, ident("a slot name"));
        }
        if (isWord("param")) {
            ++pos_;
            s->score_param_loc = peek().loc;
            if (peek().kind == Tok::STRING) {
                s->score_param_text = next().text;
                if (s->score_param_text.empty()) return errorAt(s->score_param_loc, "empty param text");
            } else {
                BLUE_TRY_ASSIGN(s->score_param, count("the kernel's param (a number or a one-token text)", 0, 0xFFFFFFFFu));
            }
        }
        return endOfLine();
    }

    // `prefer CHOSEN over REJECTED` (slot names; checked in lower.cpp).
    Status prefer(Program& p) {
        Loc l = peek().loc;
        ++pos_;
        if (p.prefer_loc.line) return errorAt(l, "'prefer' is given twice (line " + std::to_string(p.prefer_loc.line) + ")");
        p.prefer_loc = l;
        p.prefer_chosen_loc = peek().loc;
        BLUE_TRY_ASSIGN(p.prefer_chosen, ident("the preferred slot's name"));
        if (!isWord("over")) return errorAt(peek().loc, "expected 'over' after the preferred slot, found " + describe(peek()));
        ++pos_;
        p.prefer_rejected_loc = peek().loc;
        BLUE_TRY_ASSIGN(p.prefer_rejected, ident("the rejected slot's name"));
        return endOfLine();
    }

    Status block(std::vector<Stmt>* out) {
        BLUE_TRY(expectSym("{", "to open the block"));
        BLUE_TRY(endOfLine());
        if (++depth_ > kMaxNesting) return errorAt(peek().loc, strFormat("blocks nested deeper than %u", kMaxNesting));
        while (!isSym("}")) {
            if (peek().kind == Tok::END) return errorAt(peek().loc, "block not closed: expected '}'");
            Stmt s;
            BLUE_TRY(statement(&s));
            out->push_back(std::move(s));
        }
        ++pos_;
        --depth_;
        return Status::ok();
    }

    Status statement(Stmt* s) {
        const Tok& t = peek();
        s->loc = t.loc;
        if (t.kind != Tok::IDENT) return errorAt(t.loc, "expected a statement (stage, run, if, repeat, break), found " + describe(t));
        if (t.text == "stage") {
            ++pos_;
            s->kind = Stmt::STAGE;
            BLUE_TRY(stage());
            s->stage = uint32_t(prog_->stages.size() - 1);
            return endOfLine();
        }
        if (t.text == "run") {
            ++pos_;
            s->kind = Stmt::RUN;
            Loc nl = peek().loc;
            BLUE_TRY_ASSIGN(std::string name, ident("a stage name"));
            bool found = false;
            for (size_t i = 0; i < prog_->stages.size(); ++i) {
                if (prog_->stages[i].name == name) { s->stage = uint32_t(i); found = true; }
            }
            if (!found) return errorAt(nl, "no stage '" + name + "' is written before this line");
            return endOfLine();
        }
        if (t.text == "if") {
            ++pos_;
            s->kind = Stmt::IF;
            BLUE_TRY_ASSIGN(s->cond, condition());
            BLUE_TRY(block(&s->body));
            if (isWord("else")) {
                ++pos_;
                if (isWord("if")) {
                    Stmt inner;
                    BLUE_TRY(statement(&inner));
                    s->else_body.push_back(std::move(inner));
                    return Status::ok();
                }
                BLUE_TRY(block(&s->else_body));
            }
            return endOfLine();
        }
        if (t.text == "repeat") {
            ++pos_;
            s->kind = Stmt::REPEAT;
            BLUE_TRY_ASSIGN(s->count, count("the number of rounds", 1, kMaxRepeat));
            ++loop_depth_;
            BLUE_TRY(block(&s->body));
            --loop_depth_;
            return endOfLine();
        }
        if (t.text == "break") {
            ++pos_;
            s->kind = Stmt::BREAK;
            if (!loop_depth_) return errorAt(s->loc, "'break' outside a repeat block");
            if (isWord("if")) {
                ++pos_;
                BLUE_TRY_ASSIGN(s->cond, condition());
            }
            return endOfLine();
        }
        if (t.text == "score" || t.text == "filter") return scoreStmt(s);
        if (t.text == "kernel") return errorAt(t.loc, "'kernel' belongs at the top level, not inside a block");
        if (t.text == "model" || t.text == "slot" || t.text == "budget" || t.text == "context" || t.text == "output" ||
            t.text == "prefer") {
            return errorAt(t.loc, "'" + t.text + "' belongs at the top level, not inside a block");
        }
        return errorAt(t.loc, "expected a statement (stage, run, if, repeat, break), found " + describe(t));
    }

    Status stage() {
        Stage st;
        st.loc = peek().loc;
        BLUE_TRY_ASSIGN(st.name, ident("a stage name"));
        BLUE_TRY(unique(st.name, st.loc));
        if (prog_->stages.size() >= kMaxStages) return errorAt(st.loc, strFormat("more than %u stages", kMaxStages));
        BLUE_TRY(expectSym("{", "to open the stage"));
        BLUE_TRY(endOfLine());
        std::set<std::string> seen;
        while (!isSym("}")) {
            const Tok& k = peek();
            if (k.kind == Tok::END) return errorAt(k.loc, "stage '" + st.name + "' not closed: expected '}'");
            if (k.kind != Tok::IDENT) return errorAt(k.loc, "expected a stage property, found " + describe(k));
            std::string key = k.text;
            Loc kl = k.loc;
            std::string slot_key = key == "append" ? "write" : key;
            if (!seen.insert(slot_key).second) return errorAt(kl, "'" + key + "' is given twice in stage '" + st.name + "'");
            ++pos_;
            if (key == "model") {
                st.model_loc = peek().loc;
                BLUE_TRY_ASSIGN(st.model, ident("a model name"));
            } else if (key == "prompt") {
                st.prompt_loc = kl;
                for (;;) {
                    PromptPart part;
                    part.loc = peek().loc;
                    if (peek().kind == Tok::STRING) {
                        part.literal = true;
                        part.text = next().text;
                    } else {
                        BLUE_TRY_ASSIGN(part.text, ident("text, `input` or a slot name"));
                    }
                    st.prompt.push_back(std::move(part));
                    if (!isSym("+")) break;
                    ++pos_;
                    while (peek().kind == Tok::NEWLINE) ++pos_;  // a prompt may go on after a trailing +
                }
            } else if (key == "write" || key == "append") {
                st.append = key == "append";
                st.target_loc = peek().loc;
                BLUE_TRY_ASSIGN(st.target, ident("a slot name"));
            } else if (key == "select") {
                st.select_loc = kl;
                for (;;) {
                    st.option_locs.push_back(peek().loc);
                    BLUE_TRY_ASSIGN(std::string o, string("an option"));
                    if (o.empty()) return errorAt(st.option_locs.back(), "empty option");
                    st.options.push_back(o);
                    if (!isSym(",")) break;
                    ++pos_;
                }
                if (st.options.size() > 16) return errorAt(st.option_locs[16], "more than 16 options");
            } else if (key == "speculate") {
                st.speculate_loc = peek().loc;
                BLUE_TRY_ASSIGN(st.speculate, ident("a draft model's name"));
            } else if (key == "speculate_tokens") {
                BLUE_TRY_ASSIGN(st.speculate_tokens, count("speculate_tokens", 1, BLUE_SPEC_MAX_DRAFT));
            } else if (key == "fork") {
                st.fork_loc = kl;
                BLUE_TRY_ASSIGN(st.fork, count("fork", 2, kMaxBranches));
            } else if (key == "join") {
                st.join_loc = peek().loc;
                BLUE_TRY_ASSIGN(st.join, ident("a join rule (logprob, first, judge MODEL)"));
                if (st.join == "judge") {
                    st.judge_loc = peek().loc;
                    BLUE_TRY_ASSIGN(st.judge, ident("the judge's model name"));
                } else if (st.join != "logprob" && st.join != "first") {
                    return errorAt(st.join_loc, "unknown join rule '" + st.join + "' (logprob, first, judge MODEL)");
                }
            } else if (key == "max_tokens") {
                BLUE_TRY_ASSIGN(st.max_tokens, count("max_tokens", 1, 65536));
            } else if (key == "temperature") {
                BLUE_TRY_ASSIGN(st.temperature, real("temperature", 0, 100));
            } else if (key == "top_k") {
                BLUE_TRY_ASSIGN(st.top_k, count("top_k", 0, 1u << 20));
            } else if (key == "top_p") {
                BLUE_TRY_ASSIGN(st.top_p, real("top_p", 0, 1));
            } else if (key == "min_p") {
                BLUE_TRY_ASSIGN(st.min_p, real("min_p", 0, 1));
            } else if (key == "repeat_penalty") {
                BLUE_TRY_ASSIGN(st.repeat_penalty, real("repeat_penalty", 0.01, 100));
            } else if (key == "repeat_last_n") {
                BLUE_TRY_ASSIGN(st.repeat_last_n, count("repeat_last_n", 0, 65536));
            } else if (key == "stop") {
                for (;;) {
                    st.stop_locs.push_back(peek().loc);
                    BLUE_TRY_ASSIGN(std::string s, string("a stop string"));
                    if (s.empty()) return errorAt(st.stop_locs.back(), "empty stop string");
                    st.stops.push_back(s);
                    if (!isSym(",")) break;
                    ++pos_;
                }
                if (st.stops.size() > 4) return errorAt(st.stop_locs[4], "more than 4 stop strings");
            } else if (key == "skip") {
                if (!isWord("if")) return errorAt(peek().loc, "expected 'if' after 'skip'");
                ++pos_;
                BLUE_TRY_ASSIGN(st.skip_if, condition());
            } else {
                return errorAt(kl, "unknown stage property '" + key + "' (model, prompt, write, append, max_tokens, "
                                   "temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, stop, skip if, speculate, speculate_tokens, select, "
                                   "fork, join)");
            }
            BLUE_TRY(endOfLine());
        }
        Loc close = peek().loc;
        ++pos_;
        if (st.prompt.empty()) return errorAt(close, "stage '" + st.name + "' has no prompt");
        if (st.target.empty()) return errorAt(close, "stage '" + st.name + "' writes no slot (add `write SLOT` or `append SLOT`)");
        if (!st.join.empty() && st.fork < 2) return errorAt(st.join_loc, "'join' needs 'fork K' in the same stage");
        prog_->stages.push_back(std::move(st));
        return Status::ok();
    }

    // ---- conditions ----
    Result<std::unique_ptr<Cond>> condition(uint32_t depth = 0) {
        if (depth > kMaxNesting) return errorAt(peek().loc, "condition nested too deeply");
        BLUE_TRY_ASSIGN(auto left, conjunction(depth));
        while (isWord("or")) {
            auto c = std::make_unique<Cond>();
            c->kind = Cond::OR;
            c->loc = next().loc;
            c->a = std::move(left);
            BLUE_TRY_ASSIGN(c->b, conjunction(depth));
            left = std::move(c);
        }
        return left;
    }
    Result<std::unique_ptr<Cond>> conjunction(uint32_t depth) {
        BLUE_TRY_ASSIGN(auto left, negation(depth));
        while (isWord("and")) {
            auto c = std::make_unique<Cond>();
            c->kind = Cond::AND;
            c->loc = next().loc;
            c->a = std::move(left);
            BLUE_TRY_ASSIGN(c->b, negation(depth));
            left = std::move(c);
        }
        return left;
    }
    Result<std::unique_ptr<Cond>> negation(uint32_t depth) {
        if (depth > kMaxNesting) return errorAt(peek().loc, "condition nested too deeply");
        if (isWord("not")) {
            auto c = std::make_unique<Cond>();
            c->kind = Cond::NOT;
            c->loc = next().loc;
            BLUE_TRY_ASSIGN(c->a, negation(depth + 1));
            return c;
        }
        if (isSym("(")) {
            ++pos_;
            BLUE_TRY_ASSIGN(auto inner, condition(depth + 1));
            BLUE_TRY(expectSym(")", "to close the condition"));
            return inner;
        }
        auto c = std::make_unique<Cond>();
        c->loc = peek().loc;
        BLUE_TRY_ASSIGN(c->subject, ident("a stage or slot in the condition"));
        if (isWord("contains")) {
            ++pos_;
            c->kind = Cond::CONTAINS;
            c->text_loc = peek().loc;
            BLUE_TRY_ASSIGN(c->text, string("the text to look for"));
            if (c->text.empty()) return errorAt(c->text_loc, "empty text after 'contains'");
            return c;
        }
        BLUE_TRY(expectSym(".", "and a statistic after the name (e.g. draft.entropy_mean), or 'contains'"));
        c->metric_loc = peek().loc;
        BLUE_TRY_ASSIGN(c->metric, ident("a statistic"));
        static const std::set<std::string> ops = {"<", "<=", ">", ">=", "==", "!="};
        if (peek().kind != Tok::SYMBOL || !ops.count(peek().text)) {
            return errorAt(peek().loc, "expected a comparison (<, <=, >, >=, ==, !=), found " + describe(peek()));
        }
        c->op = next().text;
        BLUE_TRY_ASSIGN(c->number, number("a number to compare with"));
        return c;
    }
};

}  // namespace

Result<Program> parseCascade(std::string_view source, const std::string& file) {
    return Parser(source, file).parse();
}

}  // namespace blue
