// The reference machine (see interp.h). Each control opcode's case is a few lines; the GPU
// sequencer (shaders/sequencer.comp) implements the same cases and is tested against this.
#include "vm/interp.h"

#include <bit>
#include <climits>
#include <cmath>
#include <cstring>

#include "vm/abi.h"
#include "vm/isa.h"

namespace blue {

namespace {

float asFloat(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t asBits(float f) { return std::bit_cast<uint32_t>(f); }
int32_t asInt(uint32_t u) { return int32_t(u); }

uint32_t floatToInt(float f) {
    if (std::isnan(f)) return 0;
    if (f >= 2147483647.0f) return uint32_t(INT_MAX);
    if (f <= -2147483648.0f) return uint32_t(INT_MIN);
    return uint32_t(int32_t(f));
}

// NaN-ignoring min/max, as the GPU sequencer implements them.
float fminNan(float a, float b) { return std::isnan(a) ? b : std::isnan(b) ? a : (b < a ? b : a); }
float fmaxNan(float a, float b) { return std::isnan(a) ? b : std::isnan(b) ? a : (b > a ? b : a); }

// Integer ops on two registers that cannot fault. Returns false for any other opcode.
bool intBinary(uint8_t op, uint32_t x, uint32_t y, uint32_t* out) {
    switch (Op(op)) {
        case Op::ADD: *out = x + y; return true;
        case Op::SUB: *out = x - y; return true;
        case Op::MUL: *out = x * y; return true;
        case Op::AND: *out = x & y; return true;
        case Op::OR: *out = x | y; return true;
        case Op::XOR: *out = x ^ y; return true;
        case Op::SHL: *out = x << (y & 31); return true;
        case Op::SHRL: *out = x >> (y & 31); return true;
        case Op::SHRA: *out = uint32_t(asInt(x) >> (y & 31)); return true;
        case Op::MINS: *out = uint32_t(std::min(asInt(x), asInt(y))); return true;
        case Op::MAXS: *out = uint32_t(std::max(asInt(x), asInt(y))); return true;
        case Op::MINU: *out = std::min(x, y); return true;
        case Op::MAXU: *out = std::max(x, y); return true;
        case Op::SEQ: *out = x == y; return true;
        case Op::SNE: *out = x != y; return true;
        case Op::SLTS: *out = asInt(x) < asInt(y); return true;
        case Op::SLES: *out = asInt(x) <= asInt(y); return true;
        case Op::SLTU: *out = x < y; return true;
        case Op::SLEU: *out = x <= y; return true;
        case Op::FEQ: *out = asFloat(x) == asFloat(y); return true;
        case Op::FLT: *out = asFloat(x) < asFloat(y); return true;
        case Op::FLE: *out = asFloat(x) <= asFloat(y); return true;
        case Op::FADD: *out = asBits(asFloat(x) + asFloat(y)); return true;
        case Op::FSUB: *out = asBits(asFloat(x) - asFloat(y)); return true;
        case Op::FMUL: *out = asBits(asFloat(x) * asFloat(y)); return true;
        case Op::FDIV: *out = asBits(asFloat(x) / asFloat(y)); return true;
        case Op::FMIN: *out = asBits(fminNan(asFloat(x), asFloat(y))); return true;
        case Op::FMAX: *out = asBits(fmaxNan(asFloat(x), asFloat(y))); return true;
        default: return false;
    }
}

// Register-immediate ops: the same operations with the immediate as the second operand.
bool immBinary(uint8_t op, uint32_t x, uint32_t imm, uint32_t* out) {
    switch (Op(op)) {
        case Op::ADDI: return intBinary(uint8_t(Op::ADD), x, imm, out);
        case Op::MULI: return intBinary(uint8_t(Op::MUL), x, imm, out);
        case Op::ANDI: return intBinary(uint8_t(Op::AND), x, imm, out);
        case Op::ORI: return intBinary(uint8_t(Op::OR), x, imm, out);
        case Op::XORI: return intBinary(uint8_t(Op::XOR), x, imm, out);
        case Op::SHLI: return intBinary(uint8_t(Op::SHL), x, imm, out);
        case Op::SHRLI: return intBinary(uint8_t(Op::SHRL), x, imm, out);
        case Op::SHRAI: return intBinary(uint8_t(Op::SHRA), x, imm, out);
        case Op::SEQI: return intBinary(uint8_t(Op::SEQ), x, imm, out);
        case Op::SLTSI: return intBinary(uint8_t(Op::SLTS), x, imm, out);
        default: return false;
    }
}

bool unary(uint8_t op, uint32_t x, uint32_t* out) {
    switch (Op(op)) {
        case Op::MOV: *out = x; return true;
        case Op::FNEG: *out = x ^ 0x80000000u; return true;
        case Op::FABS: *out = x & 0x7FFFFFFFu; return true;
        case Op::FSQRT: *out = asBits(std::sqrt(asFloat(x))); return true;
        case Op::FEXP: *out = asBits(std::exp(asFloat(x))); return true;
        case Op::FLOG: *out = asBits(std::log(asFloat(x))); return true;
        case Op::FFLOOR: *out = asBits(std::floor(asFloat(x))); return true;
        case Op::ITOF: *out = asBits(float(asInt(x))); return true;
        case Op::UTOF: *out = asBits(float(x)); return true;
        case Op::FTOI: *out = floatToInt(asFloat(x)); return true;
        default: return false;
    }
}

// Branch condition; false for opcodes that are not conditional branches.
bool branchTaken(uint8_t op, uint32_t a, uint32_t b, bool* is_branch) {
    *is_branch = true;
    switch (Op(op)) {
        case Op::BEQZ: return a == 0;
        case Op::BNEZ: return a != 0;
        case Op::BEQ: return a == b;
        case Op::BNE: return a != b;
        case Op::BLTS: return asInt(a) < asInt(b);
        case Op::BGES: return asInt(a) >= asInt(b);
        case Op::BLTU: return a < b;
        case Op::BGEU: return a >= b;
        default: *is_branch = false; return false;
    }
}

uint32_t outputKind(uint8_t op) {
    switch (Op(op)) {
        case Op::OUT: return BLUE_OUT_INT;
        case Op::OUTU: return BLUE_OUT_UINT;
        case Op::OUTF: return BLUE_OUT_FLOAT;
        case Op::OUTC: return BLUE_OUT_CHAR;
        case Op::OUTS: return BLUE_OUT_STR;
        case Op::OUTT: return BLUE_OUT_TOKEN;
        case Op::OUTEND: return BLUE_OUT_END;
        case Op::OUTBEGIN: return BLUE_OUT_BEGIN;
        default: return 0;
    }
}

}  // namespace

const char* faultName(uint32_t fault) {
    switch (fault) {
        case BLUE_FAULT_NONE: return "no fault";
        case BLUE_FAULT_DIV_ZERO: return "integer division by zero";
        case BLUE_FAULT_LOCAL_OOB: return "local memory access out of range";
        case BLUE_FAULT_HEAP_OOB: return "heap access out of range";
        case BLUE_FAULT_CONST_OOB: return "constant pool access out of range";
        case BLUE_FAULT_STACK_OVERFLOW: return "call stack overflow";
        case BLUE_FAULT_STACK_UNDERFLOW: return "return with an empty call stack";
        case BLUE_FAULT_BAD_INSTANCE: return "mailbox send to a nonexistent instance";
        case BLUE_FAULT_INPUT_OOB: return "input slot or word out of range";
        case BLUE_FAULT_TENSOR_OOB: return "tensor word out of range";
        case BLUE_FAULT_BLOCK_ROWS: return "block row count is 0 or above max_rows";
        case BLUE_FAULT_PC_OOB: return "ran past the end of the code";
        case BLUE_FAULT_BAD_OPCODE: return "invalid opcode";
        case BLUE_FAULT_WALK: return "HASHL, HCMPL or HCPYL over more than 8 words";
    }
    return "unknown fault";
}

std::string describeFaults(const Module& m, const std::vector<InstanceReport>& insts,
                           size_t limit) {
    std::string out;
    size_t shown = 0, total = 0;
    for (size_t i = 0; i < insts.size(); ++i) {
        if (insts[i].status != BLUE_ST_FAULT) continue;
        ++total;
        if (shown == limit) continue;
        ++shown;
        uint32_t pc = insts[i].pc;
        const OpInfo* info = pc < m.instrCount() ? opInfo(uint8_t(m.code[pc * 2])) : nullptr;
        out += strFormat("instance %zu: %s at instruction %u (%s)\n", i, faultName(insts[i].fault),
                         pc, info ? std::string(info->name).c_str() : "?");
    }
    if (total > shown) out += strFormat("... and %zu more faulted instances\n", total - shown);
    return out;
}

std::string describeUnfinished(const std::vector<InstanceReport>& insts, uint64_t cycles) {
    std::string ids;
    size_t live = 0;
    for (size_t i = 0; i < insts.size(); ++i) {
        if (insts[i].status != BLUE_ST_RUNNING && insts[i].status != BLUE_ST_PARKED) continue;
        if (++live <= 8) ids += strFormat("%s%zu (pc %u)", live > 1 ? ", " : "", i, insts[i].pc);
    }
    if (live > 8) ids += strFormat(" and %zu more", live - 8);
    return strFormat("watchdog: the program did not finish within %llu cycles (--max-cycles); "
                     "%zu instance%s still running: %s",
                     (unsigned long long)cycles, live, live == 1 ? "" : "s", ids.c_str());
}

RefMachine::RefMachine(const Module& m, const WeightSource& weights, MachineOptions options)
    : m_(m), opt_(options) {
    const Layout& l = m.layout;
    insts_.resize(options.instances);
    for (Inst& in : insts_) {
        in.pc = l.entry;
        in.regs.assign(l.regs, 0);
        in.stack.assign(l.stack_depth, 0);
    }
    heap_.assign(l.heap_words, 0);
    flags_.assign(options.instances, 0);
    bump_ = l.heap_static;
    block_args_.assign(size_t(options.instances) * BLUE_MAX_BLOCK_ARGS, 0);
    locals_.assign(size_t(options.instances) * l.local_words, 0);
    slots_.resize(l.in_slots);
    slot_busy_.assign(l.in_slots, false);
    allocRefTensors(m, options.instances, &tensors_);
    for (uint32_t t = 0; t < m.tensors.size(); ++t) {
        std::span<const uint8_t> bytes = weights.tensorBytes(t);
        if (!bytes.empty()) std::memcpy(tensors_.data[t].data(), bytes.data(), bytes.size());
    }
}

void RefMachine::pushInput(std::vector<uint32_t> message) { pending_.push_back(std::move(message)); }
void RefMachine::closeInput() { input_closed_ = true; }

void RefMachine::feedInput() {
    while (!pending_.empty() && !slots_.empty()) {
        size_t slot = published_ % slots_.size();
        if (slot_busy_[slot]) break;
        slots_[slot] = std::move(pending_.front());
        pending_.pop_front();
        slot_busy_[slot] = true;
        ++published_;
    }
}

RefMachine::Next RefMachine::fault(Inst& in, uint32_t code) {
    in.status = BLUE_ST_FAULT;
    in.fault = code;
    return Next::STOP;
}

RefMachine::Next RefMachine::execRun(uint32_t id, Inst& in, uint32_t block, uint32_t arg_reg,
                                     BlockRun* runs) {
    const BlockDecl& b = m_.blocks[block];
    uint32_t rows = b.nargs > 0 ? in.regs[arg_reg] : 1;
    if (rows == 0 || rows > m_.layout.max_rows) return fault(in, BLUE_FAULT_BLOCK_ROWS);
    BlockRun& run = runs[block];
    if (run.row_inst.size() + rows > m_.layout.max_rows) return Next::STOP;  // full: retry
    run.insts.push_back(id);
    run.inst_base.push_back(uint32_t(run.row_inst.size()));
    run.inst_rows.push_back(rows);
    for (uint32_t r = 0; r < rows; ++r) {
        run.row_inst.push_back(id);
        run.row_local.push_back(r);
    }
    for (uint32_t k = 0; k < b.nargs; ++k) {
        block_args_[size_t(id) * BLUE_MAX_BLOCK_ARGS + k] = in.regs[arg_reg + k];
    }
    in.status = BLUE_ST_PARKED;
    ++in.pc;
    return Next::STOP;
}

RefMachine::Next RefMachine::execInput(uint32_t id, Inst& in, uint8_t op, uint32_t a, uint32_t b,
                                       uint32_t c) {
    uint32_t* r = in.regs.data();
    const Layout& l = m_.layout;
    auto slotOk = [&](uint32_t s) { return s < slots_.size() && slot_busy_[s]; };
    switch (Op(op)) {
        case Op::INPEEK:
            if (claimed_ < published_) {
                r[a] = uint32_t(claimed_ % slots_.size());
            } else {
                r[a] = input_closed_ && pending_.empty() ? 0xFFFFFFFFu : 0xFFFFFFFEu;
            }
            break;
        case Op::INRECV:
        case Op::INPOLL:
            if (claimed_ < published_) {
                r[a] = uint32_t(claimed_++ % slots_.size());
            } else if (input_closed_ && pending_.empty()) {
                r[a] = 0xFFFFFFFFu;
            } else if (Op(op) == Op::INPOLL) {
                r[a] = 0xFFFFFFFEu;  // nothing now
            } else {
                return Next::STOP;  // wait for input
            }
            break;
        case Op::INLEN:
            if (!slotOk(r[b])) return fault(in, BLUE_FAULT_INPUT_OOB);
            r[a] = uint32_t(slots_[r[b]].size());
            break;
        case Op::INLD:
            if (!slotOk(r[b]) || r[c] >= slots_[r[b]].size()) return fault(in, BLUE_FAULT_INPUT_OOB);
            r[a] = slots_[r[b]][r[c]];
            break;
        case Op::INCPY: {
            if (!slotOk(r[b]) || r[c] > slots_[r[b]].size()) return fault(in, BLUE_FAULT_INPUT_OOB);
            const std::vector<uint32_t>& msg = slots_[r[b]];
            uint64_t n = msg.size() - r[c];
            if (r[a] > l.local_words || n > l.local_words - r[a]) return fault(in, BLUE_FAULT_LOCAL_OOB);
            for (uint64_t i = 0; i < n; ++i) in.local[r[a] + i] = msg[r[c] + i];
            r[a] = uint32_t(n);
            break;
        }
        case Op::INTCPY: {  // c: the tensor
            if (!slotOk(r[b]) || r[a] >= slots_[r[b]].size()) return fault(in, BLUE_FAULT_INPUT_OOB);
            const std::vector<uint32_t>& msg = slots_[r[b]];
            uint64_t n = msg[r[a]];
            if (n > msg.size() - r[a] - 1) return fault(in, BLUE_FAULT_INPUT_OOB);
            const TensorDecl& t = m_.tensors[c];
            if (n > t.elements()) return fault(in, BLUE_FAULT_TENSOR_OOB);
            uint32_t* words = reinterpret_cast<uint32_t*>(tensors_.data[c].data()) +
                              (t.cls == BLUE_TC_INSTANCE ? uint64_t(id) * t.elements() : 0);
            std::copy(msg.begin() + r[a] + 1, msg.begin() + r[a] + 1 + n, words);
            r[a] += uint32_t(1 + n);
            break;
        }
        case Op::INCMP: {
            if (!slotOk(r[b]) || r[c] > slots_[r[b]].size()) return fault(in, BLUE_FAULT_INPUT_OOB);
            if (r[a] > l.local_words) return fault(in, BLUE_FAULT_LOCAL_OOB);
            const std::vector<uint32_t>& msg = slots_[r[b]];
            uint64_t n = std::min<uint64_t>(msg.size() - r[c], l.local_words - r[a]), i = 0;
            while (i < n && in.local[r[a] + i] == msg[r[c] + i]) ++i;
            r[a] = uint32_t(i);
            break;
        }
        case Op::INFREE:
            if (!slotOk(r[a])) return fault(in, BLUE_FAULT_INPUT_OOB);
            slot_busy_[r[a]] = false;
            break;
        case Op::INFLAG: r[a] = r[b] < flags_.size() ? flags_[r[b]] : 0; break;
        default: return fault(in, BLUE_FAULT_BAD_OPCODE);
    }
    ++in.pc;
    return Next::CONTINUE;
}

// HASHL, HCMPL, HCPYL: at most BLUE_MAX_WALK words of local memory from r[b], hashed into r[a]
// or compared with / copied to the heap from r[a]. Faults are checked in the sequencer's order.
RefMachine::Next RefMachine::execWalk(Inst& in, uint8_t op, uint32_t a, uint32_t b, uint32_t c) {
    uint32_t* r = in.regs.data();
    const Layout& l = m_.layout;
    const uint32_t n = r[c], at = r[b];
    if (n > BLUE_MAX_WALK) return fault(in, BLUE_FAULT_WALK);
    if (at > l.local_words || n > l.local_words - at) return fault(in, BLUE_FAULT_LOCAL_OOB);
    const uint32_t* words = in.local.data() + at;
    if (Op(op) == Op::HASHL) {
        uint32_t h = r[a];
        for (uint32_t i = 0; i < n; ++i) h = (h ^ words[i]) * 16777619u;
        r[a] = h;
    } else {
        const uint32_t hw = r[a];
        if (hw > l.heap_words || n > l.heap_words - hw) return fault(in, BLUE_FAULT_HEAP_OOB);
        if (Op(op) == Op::HCPYL) {
            std::copy(words, words + n, heap_.begin() + hw);
        } else {
            uint32_t i = 0;
            while (i < n && heap_[hw + i] == words[i]) ++i;
            r[a] = i;
        }
    }
    ++in.pc;
    return Next::CONTINUE;
}

RefMachine::Next RefMachine::step(uint32_t id, Inst& in, BlockRun* runs, RunReport* report) {
    if (in.pc >= m_.instrCount()) return fault(in, BLUE_FAULT_PC_OOB);
    Instr ins = decodeInstr(m_.code[in.pc * 2], m_.code[in.pc * 2 + 1]);
    uint32_t* r = in.regs.data();
    const uint32_t a = ins.a, b = ins.b, c = ins.c, imm = ins.imm;
    const Layout& l = m_.layout;
    uint32_t value = 0;
    bool is_branch = false;
    bool taken = branchTaken(ins.op, r[a], r[b], &is_branch);
    if (is_branch) {
        in.pc = taken ? imm : in.pc + 1;
        return Next::CONTINUE;
    }
    if (intBinary(ins.op, r[b], r[c], &value) || immBinary(ins.op, r[b], imm, &value) ||
        unary(ins.op, r[b], &value)) {
        r[a] = value;
        ++in.pc;
        return Next::CONTINUE;
    }
    if (uint32_t kind = outputKind(ins.op)) {
        report->output.push_back({id, kind, ins.op == uint8_t(Op::OUTS) ? imm : r[a]});
        ++in.pc;
        return Next::CONTINUE;
    }
    switch (Op(ins.op)) {
        case Op::NOP: break;
        case Op::HALT: in.status = BLUE_ST_HALTED; return Next::STOP;
        case Op::YIELD: ++in.pc; return Next::STOP;
        case Op::JMP: in.pc = imm; return Next::CONTINUE;
        case Op::CALL:
            if (in.sp >= l.stack_depth) return fault(in, BLUE_FAULT_STACK_OVERFLOW);
            in.stack[in.sp++] = in.pc + 1;
            in.pc = imm;
            return Next::CONTINUE;
        case Op::RET:
            if (in.sp == 0) return fault(in, BLUE_FAULT_STACK_UNDERFLOW);
            in.pc = in.stack[--in.sp];
            return Next::CONTINUE;
        case Op::RUN: return execRun(id, in, imm, a, runs);
        case Op::LI:
        case Op::LF: r[a] = imm; break;
        case Op::DIVS:
        case Op::REMS: {
            if (r[c] == 0) return fault(in, BLUE_FAULT_DIV_ZERO);
            bool overflow = asInt(r[b]) == INT_MIN && asInt(r[c]) == -1;
            if (ins.op == uint8_t(Op::DIVS)) {
                r[a] = overflow ? r[b] : uint32_t(asInt(r[b]) / asInt(r[c]));
            } else {
                r[a] = overflow ? 0 : uint32_t(asInt(r[b]) % asInt(r[c]));
            }
            break;
        }
        case Op::DIVU:
        case Op::REMU:
            if (r[c] == 0) return fault(in, BLUE_FAULT_DIV_ZERO);
            r[a] = ins.op == uint8_t(Op::DIVU) ? r[b] / r[c] : r[b] % r[c];
            break;
        case Op::IID: r[a] = id; break;
        case Op::NINST: r[a] = opt_.instances; break;
        case Op::CYCLE: r[a] = uint32_t(cycle_); break;
        case Op::LD:
        case Op::ST: {
            uint32_t addr = r[b] + imm;
            if (addr >= l.local_words) return fault(in, BLUE_FAULT_LOCAL_OOB);
            if (ins.op == uint8_t(Op::LD)) r[a] = in.local[addr]; else in.local[addr] = r[a];
            break;
        }
        case Op::LDG:
        case Op::STG: {
            uint32_t addr = r[b] + imm;
            if (addr >= l.heap_words) return fault(in, BLUE_FAULT_HEAP_OOB);
            if (ins.op == uint8_t(Op::LDG)) r[a] = heap_[addr]; else heap_[addr] = r[a];
            break;
        }
        case Op::LDK: {
            uint32_t addr = r[b] + imm;
            if (addr >= m_.consts.size()) return fault(in, BLUE_FAULT_CONST_OOB);
            r[a] = m_.consts[addr];
            break;
        }
        case Op::ATOMADD:
        case Op::ATOMXCHG:
        case Op::ATOMMAXS:
        case Op::ATOMMINS:
        case Op::ATOMCAS: {
            if (r[b] >= l.heap_words) return fault(in, BLUE_FAULT_HEAP_OOB);
            uint32_t& cell = heap_[r[b]];
            uint32_t old = cell;
            switch (Op(ins.op)) {
                case Op::ATOMADD: cell = old + r[c]; break;
                case Op::ATOMXCHG: cell = r[c]; break;
                case Op::ATOMMAXS: cell = uint32_t(std::max(asInt(old), asInt(r[c]))); break;
                case Op::ATOMMINS: cell = uint32_t(std::min(asInt(old), asInt(r[c]))); break;
                default: if (old == r[a]) cell = r[c]; break;
            }
            r[a] = old;
            break;
        }
        case Op::ALLOC:
            if (r[b] <= l.heap_words - bump_) {
                r[a] = bump_;
                bump_ += r[b];
            } else {
                r[a] = 0xFFFFFFFFu;
            }
            break;
        case Op::TLD:
        case Op::TST: {
            const TensorDecl& t = m_.tensors[imm];
            if (r[b] >= t.elements()) return fault(in, BLUE_FAULT_TENSOR_OOB);
            uint64_t base = t.cls == BLUE_TC_INSTANCE ? uint64_t(id) * t.elements() : 0;
            uint32_t* words = reinterpret_cast<uint32_t*>(tensors_.data[imm].data());
            if (ins.op == uint8_t(Op::TLD)) r[a] = words[base + r[b]]; else words[base + r[b]] = r[a];
            break;
        }
        case Op::SEND: {
            if (r[a] >= insts_.size()) return fault(in, BLUE_FAULT_BAD_INSTANCE);
            auto& box = insts_[r[a]].mailbox;
            if (box.size() >= l.mailbox_cap) return Next::STOP;  // full: retry next cycle
            box.emplace_back(r[b], cycle_);
            break;
        }
        case Op::RECV:
            // Only messages sent in an earlier cycle can be received.
            if (in.mailbox.empty() || in.mailbox.front().second == cycle_) return Next::STOP;
            r[a] = in.mailbox.front().first;
            in.mailbox.pop_front();
            break;
        case Op::INRECV:
        case Op::INPOLL:
        case Op::INPEEK:
        case Op::INLEN:
        case Op::INLD:
        case Op::INCPY:
        case Op::INCMP:
        case Op::INFREE:
        case Op::INFLAG: return execInput(id, in, ins.op, a, b, c);
        case Op::INTCPY: return execInput(id, in, ins.op, a, b, imm);
        case Op::HASHL:
        case Op::HCMPL:
        case Op::HCPYL: return execWalk(in, ins.op, a, b, c);
        default: return fault(in, BLUE_FAULT_BAD_OPCODE);
    }
    ++in.pc;
    return Next::CONTINUE;
}

void RefMachine::runSequencer(RunReport* report, BlockRun* runs) {
    for (uint32_t id = 0; id < insts_.size(); ++id) {
        Inst& in = insts_[id];
        if (in.status == BLUE_ST_PARKED) in.status = BLUE_ST_RUNNING;
        if (in.status != BLUE_ST_RUNNING) continue;
        in.local = std::span<uint32_t>(locals_).subspan(size_t(id) * m_.layout.local_words,
                                                         m_.layout.local_words);
        const uint32_t budget = opt_.cycle_steps ? std::min(opt_.cycle_steps, m_.layout.max_steps) : m_.layout.max_steps;
        for (uint32_t s = 0; s < budget; ++s) {
            ++report->steps;
            if (step(id, in, runs, report) == Next::STOP) break;
        }
    }
}

void RefMachine::runBlocks(BlockRun* runs, RunReport* report) {
    for (uint32_t b = 0; b < m_.blocks.size(); ++b) {
        if (runs[b].insts.empty()) continue;
        ++report->block_runs;
        std::vector<TensorInstr> instrs;
        Status s = decodeBlock(m_, m_.blocks[b], &instrs);
        assert(s.isOk() && "blocks are checked by verifyModule");
        TensorOpEnv env{&m_, &tensors_, &runs[b], uint32_t(insts_.size()), block_args_, locals_};
        for (const TensorInstr& ti : instrs) runTensorOpRef(env, ti);
    }
}

RunReport RefMachine::run() {
    RunReport report;
    std::vector<BlockRun> runs(m_.blocks.size());
    size_t delivered = 0;  // records passed to on_output_
    for (;;) {
        bool live = false;
        for (const Inst& in : insts_) {
            live |= in.status == BLUE_ST_RUNNING || in.status == BLUE_ST_PARKED;
        }
        if (!live) break;
        if (cycle_ >= opt_.max_cycles) {
            report.instances.clear();
            for (const Inst& in : insts_) report.instances.push_back({in.pc, in.status, in.fault});
            report.status = Status::error(describeUnfinished(report.instances, cycle_));
            break;
        }
        feedInput();
        for (BlockRun& r : runs) r = BlockRun{};
        runSequencer(&report, runs.data());
        runBlocks(runs.data(), &report);
        if (on_output_ && report.output.size() > delivered) {
            on_output_(std::span<const OutputRecord>(report.output).subspan(delivered));
            delivered = report.output.size();
        }
        if (after_cycle_) after_cycle_(cycle_);
        ++cycle_;
    }
    report.cycles = cycle_;
    report.instances.clear();
    for (const Inst& in : insts_) report.instances.push_back({in.pc, in.status, in.fault});
    return report;
}

Status refCanRun(const Module& m) {
    if (m.kernels.empty()) return Status::ok();
    std::string names;
    for (const KernelDecl& k : m.kernels) names += (names.empty() ? "'" : ", '") + k.name + "'";
    return BLUE_ERROR("the module runs custom kernels (%s), which are SPIR-V: the reference interpreter (--ref) cannot run "
                      "them; run it on a Vulkan device instead",
                      names.c_str());
}

}  // namespace blue
