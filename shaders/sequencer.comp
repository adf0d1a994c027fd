#version 450
#extension GL_GOOGLE_include_directive : require
// The sequencer: interprets Blue-IR control code on the GPU, one invocation per instance. Each
// live instance runs until it parks on a block (RUN), yields, halts, faults or has run max_steps
// instructions. Semantics are those of the reference machine (vm/interp.cpp), case for case.
#extension GL_KHR_shader_subgroup_ballot : require
#define BLUE_CONTROL_COHERENT coherent
#include "common/bindings.glsl"
#include "opcodes.glsl"

layout(local_size_x = BLUE_SEQ_WG) in;

const uint CONTINUE = 0u;
const uint STOP = 1u;

uint g_id, g_regs, g_state, g_pc, g_status, g_fault, g_sp;

#define R(i) ctl[g_regs + (i)]

uint fault(uint code) {
    g_status = BLUE_ST_FAULT;
    g_fault = code;
    return STOP;
}

float asF(uint u) { return uintBitsToFloat(u); }
uint asU(float f) { return floatBitsToUint(f); }

float fminNan(float a, float b) { return isnan(a) ? b : isnan(b) ? a : (b < a ? b : a); }
float fmaxNan(float a, float b) { return isnan(a) ? b : isnan(b) ? a : (b > a ? b : a); }

uint floatToInt(float f) {
    if (isnan(f)) return 0u;
    if (f >= 2147483647.0) return 0x7FFFFFFFu;
    if (f <= -2147483648.0) return 0x80000000u;
    return uint(int(f));
}

// Two-register operations that cannot fault; `ok` is false for other opcodes.
uint binary(uint op, uint x, uint y, out bool ok) {
    ok = true;
    switch (op) {
        case OP_ADD: return x + y;
        case OP_SUB: return x - y;
        case OP_MUL: return x * y;
        case OP_AND: return x & y;
        case OP_OR: return x | y;
        case OP_XOR: return x ^ y;
        case OP_SHL: return x << (y & 31u);
        case OP_SHRL: return x >> (y & 31u);
        case OP_SHRA: return uint(int(x) >> int(y & 31u));
        case OP_MINS: return uint(min(int(x), int(y)));
        case OP_MAXS: return uint(max(int(x), int(y)));
        case OP_MINU: return min(x, y);
        case OP_MAXU: return max(x, y);
        case OP_SEQ: return uint(x == y);
        case OP_SNE: return uint(x != y);
        case OP_SLTS: return uint(int(x) < int(y));
        case OP_SLES: return uint(int(x) <= int(y));
        case OP_SLTU: return uint(x < y);
        case OP_SLEU: return uint(x <= y);
        case OP_FEQ: return uint(asF(x) == asF(y));
        case OP_FLT: return uint(asF(x) < asF(y));
        case OP_FLE: return uint(asF(x) <= asF(y));
        case OP_FADD: return asU(asF(x) + asF(y));
        case OP_FSUB: return asU(asF(x) - asF(y));
        case OP_FMUL: return asU(asF(x) * asF(y));
        case OP_FDIV: return asU(asF(x) / asF(y));
        case OP_FMIN: return asU(fminNan(asF(x), asF(y)));
        case OP_FMAX: return asU(fmaxNan(asF(x), asF(y)));
    }
    ok = false;
    return 0u;
}

// Register-immediate forms map onto the two-register operations.
uint immBase(uint op) {
    switch (op) {
        case OP_ADDI: return OP_ADD;
        case OP_MULI: return OP_MUL;
        case OP_ANDI: return OP_AND;
        case OP_ORI: return OP_OR;
        case OP_XORI: return OP_XOR;
        case OP_SHLI: return OP_SHL;
        case OP_SHRLI: return OP_SHRL;
        case OP_SHRAI: return OP_SHRA;
        case OP_SEQI: return OP_SEQ;
        case OP_SLTSI: return OP_SLTS;
    }
    return 0xFFu;
}

uint unary(uint op, uint x, out bool ok) {
    ok = true;
    switch (op) {
        case OP_MOV: return x;
        case OP_FNEG: return x ^ 0x80000000u;
        case OP_FABS: return x & 0x7FFFFFFFu;
        case OP_FSQRT: return asU(sqrt(asF(x)));
        case OP_FEXP: return asU(exp(asF(x)));
        case OP_FLOG: return asU(log(asF(x)));
        case OP_FFLOOR: return asU(floor(asF(x)));
        case OP_ITOF: return asU(float(int(x)));
        case OP_UTOF: return asU(float(x));
        case OP_FTOI: return floatToInt(asF(x));
    }
    ok = false;
    return 0u;
}

// Conditional branches: returns 0 not a branch, 1 not taken, 2 taken.
uint branch(uint op, uint a, uint b) {
    bool t;
    switch (op) {
        case OP_BEQZ: t = a == 0u; break;
        case OP_BNEZ: t = a != 0u; break;
        case OP_BEQ: t = a == b; break;
        case OP_BNE: t = a != b; break;
        case OP_BLTS: t = int(a) < int(b); break;
        case OP_BGES: t = int(a) >= int(b); break;
        case OP_BLTU: t = a < b; break;
        case OP_BGEU: t = a >= b; break;
        default: return 0u;
    }
    return t ? 2u : 1u;
}

uint outputKind(uint op) {
    switch (op) {
        case OP_OUT: return BLUE_OUT_INT;
        case OP_OUTU: return BLUE_OUT_UINT;
        case OP_OUTF: return BLUE_OUT_FLOAT;
        case OP_OUTC: return BLUE_OUT_CHAR;
        case OP_OUTS: return BLUE_OUT_STR;
        case OP_OUTT: return BLUE_OUT_TOKEN;
        case OP_OUTEND: return BLUE_OUT_END;
    }
    return 0u;
}

// Appends a record to the output ring; false when the ring is full (the instance yields).
bool emit(uint kind, uint value) {
    uint cap = ctl[BLUE_H_OUT_CAP];
    uint head = ctl[BLUE_C_OUT_HEAD];
    for (;;) {
        if (head - ctl[BLUE_C_OUT_TAIL] >= cap) return false;
        uint prev = atomicCompSwap(ctl[BLUE_C_OUT_HEAD], head, head + 1u);
        if (prev == head) break;
        head = prev;
    }
    uint rec = ctl[BLUE_H_IO_OUT] + (head % cap) * 2u;
    io[rec] = g_id | (kind << 24);
    io[rec + 1u] = value;
    return true;
}

uint execRun(uint block, uint a) {
    uint blk = ctl[BLUE_O_BLOCKS] + block * BLUE_BLOCK_WORDS;
    uint nargs = ctl[blk + BLUE_B_NARGS];
    uint max_rows = ctl[BLUE_H_MAX_ROWS];
    uint rows = nargs > 0u ? R(a) : 1u;
    if (rows == 0u || rows > max_rows) return fault(BLUE_FAULT_BLOCK_ROWS);
    uint base = ctl[blk + BLUE_B_ACC_ROWS];
    for (;;) {
        if (base + rows > max_rows) return STOP;  // full this cycle: retry next cycle
        uint prev = atomicCompSwap(ctl[blk + BLUE_B_ACC_ROWS], base, base + rows);
        if (prev == base) break;
        base = prev;
    }
    uint n = ctl[BLUE_H_NINST];
    uint k = atomicAdd(ctl[blk + BLUE_B_ACC_INSTS], 1u);
    uint lists = ctl[BLUE_O_LISTS] + block * 3u * n;
    ctl[lists + k] = g_id;
    ctl[lists + n + k] = base;
    ctl[lists + 2u * n + k] = rows;
    uint rowmap = ctl[BLUE_O_ROWMAP] + block * max_rows * 2u;
    for (uint r = 0u; r < rows; ++r) {
        ctl[rowmap + (base + r) * 2u] = g_id;
        ctl[rowmap + (base + r) * 2u + 1u] = r;
    }
    uint bargs = ctl[BLUE_O_BARGS] + g_id * BLUE_MAX_BLOCK_ARGS;
    for (uint i = 0u; i < nargs; ++i) ctl[bargs + i] = R(a + i);
    g_status = BLUE_ST_PARKED;
    g_pc += 1u;
    return STOP;
}

// Mailbox slots hold {flag, value}. The flag packs the message's sequence number (low 16 bits)
// and the cycle it was sent in (high 16 bits); a receiver takes only messages sent in an earlier
// cycle. That makes delivery deterministic and needs no memory fence inside the dispatch: the
// value was stored in an earlier dispatch, so the barrier between dispatches made it visible.
uint execMailbox(uint op, uint a, uint b) {
    uint cap = ctl[BLUE_H_MAILBOX_CAP];
    uint words = 2u + 2u * cap;
    uint cycle16 = ctl[BLUE_C_CYCLE] & 0xFFFFu;
    if (op == OP_SEND) {
        uint target = R(a);
        if (target >= ctl[BLUE_H_NINST]) return fault(BLUE_FAULT_BAD_INSTANCE);
        uint box = ctl[BLUE_O_MAILBOX] + target * words;
        uint tail = ctl[box + 1u];
        for (;;) {
            if (tail - atomicAdd(ctl[box], 0u) >= cap) return STOP;  // full: retry next cycle
            uint prev = atomicCompSwap(ctl[box + 1u], tail, tail + 1u);
            if (prev == tail) break;
            tail = prev;
        }
        uint slot = box + 2u + (tail % cap) * 2u;
        ctl[slot + 1u] = R(b);
        atomicExchange(ctl[slot], ((tail + 1u) & 0xFFFFu) | (cycle16 << 16));
    } else {  // RECV
        uint box = ctl[BLUE_O_MAILBOX] + g_id * words;
        uint head = ctl[box];
        uint slot = box + 2u + (head % cap) * 2u;
        uint flag = atomicAdd(ctl[slot], 0u);
        if ((flag & 0xFFFFu) != ((head + 1u) & 0xFFFFu) || (flag >> 16) == cycle16) {
            return STOP;  // nothing sent before this cycle: retry next cycle
        }
        R(a) = ctl[slot + 1u];
        atomicExchange(ctl[box], head + 1u);
    }
    g_pc += 1u;
    return CONTINUE;
}

bool slotValid(uint s) {
    return s < ctl[BLUE_H_IN_SLOTS] && io[ctl[BLUE_H_IO_SLOTSTATE] + s] == BLUE_IO_SLOT_FULL;
}

uint execInput(uint op, uint a, uint b, uint c) {
    uint slot_words = ctl[BLUE_H_IN_SLOT_WORDS];
    if (op == OP_INRECV) {
        uint claimed = ctl[BLUE_C_IN_CLAIM];
        for (;;) {
            if (claimed >= ctl[BLUE_C_IN_PUBLISHED]) {
                if (ctl[BLUE_C_IN_CLOSED] == 0u) return STOP;  // wait for input
                R(a) = 0xFFFFFFFFu;
                break;
            }
            uint prev = atomicCompSwap(ctl[BLUE_C_IN_CLAIM], claimed, claimed + 1u);
            if (prev == claimed) {
                R(a) = io[ctl[BLUE_H_IO_ORDER] + claimed % ctl[BLUE_H_IN_SLOTS]];
                break;
            }
            claimed = prev;
        }
    } else if (op == OP_INFREE) {
        if (!slotValid(R(a))) return fault(BLUE_FAULT_INPUT_OOB);
        io[ctl[BLUE_H_IO_SLOTSTATE] + R(a)] = BLUE_IO_SLOT_FREE;
    } else {
        uint s = R(b);
        if (!slotValid(s)) return fault(BLUE_FAULT_INPUT_OOB);
        uint msg = ctl[BLUE_H_IO_SLOTS] + s * slot_words;
        uint len = io[msg];
        if (op == OP_INLEN) {
            R(a) = len;
        } else if (op == OP_INLD) {
            if (R(c) >= len) return fault(BLUE_FAULT_INPUT_OOB);
            R(a) = io[msg + 1u + R(c)];
        } else {  // INCPY
            uint start = R(c), dst = R(a), lw = ctl[BLUE_H_LOCAL_WORDS];
            if (start > len) return fault(BLUE_FAULT_INPUT_OOB);
            uint n = len - start;
            if (dst > lw || n > lw - dst) return fault(BLUE_FAULT_LOCAL_OOB);
            uint local = ctl[BLUE_O_LOCAL] + g_id * lw + dst;
            for (uint i = 0u; i < n; ++i) ctl[local + i] = io[msg + 1u + start + i];
            R(a) = n;
        }
    }
    g_pc += 1u;
    return CONTINUE;
}

uint execAtomic(uint op, uint a, uint b, uint c) {
    if (R(b) >= ctl[BLUE_H_HEAP_WORDS]) return fault(BLUE_FAULT_HEAP_OOB);
    uint addr = ctl[BLUE_O_HEAP] + R(b);
    uint v = R(c);
    switch (op) {
        case OP_ATOMADD: R(a) = atomicAdd(ctl[addr], v); break;
        case OP_ATOMXCHG: R(a) = atomicExchange(ctl[addr], v); break;
        case OP_ATOMMAXS: R(a) = uint(atomicMax(ctl_i[addr], int(v))); break;
        case OP_ATOMMINS: R(a) = uint(atomicMin(ctl_i[addr], int(v))); break;
        default: R(a) = atomicCompSwap(ctl[addr], R(a), v); break;  // ATOMCAS
    }
    g_pc += 1u;
    return CONTINUE;
}

// Page access with a per-invocation page index. Descriptor arrays may only be indexed with
// dynamically uniform values unless the device has non-uniform indexing (lavapipe does not), so
// each page gets its own constant-index branch.
#define BLUE_PAGE_CASE(p) case p: if (store) page_u[p].d[w] = v; else v = page_u[p].d[w]; break;
uint pageAccess(uint page, uint w, uint v, bool store) {
    switch (page) {
        BLUE_PAGE_CASE(0) BLUE_PAGE_CASE(1) BLUE_PAGE_CASE(2) BLUE_PAGE_CASE(3)
        BLUE_PAGE_CASE(4) BLUE_PAGE_CASE(5) BLUE_PAGE_CASE(6) BLUE_PAGE_CASE(7)
        BLUE_PAGE_CASE(8) BLUE_PAGE_CASE(9) BLUE_PAGE_CASE(10) BLUE_PAGE_CASE(11)
        BLUE_PAGE_CASE(12) BLUE_PAGE_CASE(13) BLUE_PAGE_CASE(14) BLUE_PAGE_CASE(15)
        BLUE_PAGE_CASE(16) BLUE_PAGE_CASE(17) BLUE_PAGE_CASE(18) BLUE_PAGE_CASE(19)
        BLUE_PAGE_CASE(20) BLUE_PAGE_CASE(21) BLUE_PAGE_CASE(22) BLUE_PAGE_CASE(23)
    }
    return v;
}
uint pageLoad(uint page, uint w) { return pageAccess(page, w, 0u, false); }
void pageStore(uint page, uint w, uint v) { pageAccess(page, w, v, true); }

uint execTensorWord(uint op, uint a, uint b, uint t) {
    uint ref = ctl[BLUE_O_TENSORS] + t * BLUE_TREF_WORDS;
    uint n = ctl[ref + 3u];
    if (R(b) >= n) return fault(BLUE_FAULT_TENSOR_OOB);
    uint page = ctl[ref] & 0xFFFFu;
    uint cls = ctl[ref] >> 16;
    uint byte_off = ctl[ref + 1u] + (cls == BLUE_TC_INSTANCE ? g_id * ctl[ref + 2u] : 0u);
    uint w = byte_off / 4u + R(b);
    if (op == OP_TLD) {
        R(a) = pageLoad(page, w);
    } else {
        pageStore(page, w, R(a));
    }
    g_pc += 1u;
    return CONTINUE;
}

uint execMemory(uint op, uint a, uint b, uint imm) {
    uint addr = R(b) + imm;
    if (op == OP_LD || op == OP_ST) {
        uint lw = ctl[BLUE_H_LOCAL_WORDS];
        if (addr >= lw) return fault(BLUE_FAULT_LOCAL_OOB);
        uint p = ctl[BLUE_O_LOCAL] + g_id * lw + addr;
        if (op == OP_LD) R(a) = ctl[p]; else ctl[p] = R(a);
    } else if (op == OP_LDG || op == OP_STG) {
        if (addr >= ctl[BLUE_H_HEAP_WORDS]) return fault(BLUE_FAULT_HEAP_OOB);
        uint p = ctl[BLUE_O_HEAP] + addr;
        if (op == OP_LDG) R(a) = ctl[p]; else ctl[p] = R(a);
    } else {  // LDK
        if (addr >= ctl[BLUE_H_CONST_WORDS]) return fault(BLUE_FAULT_CONST_OOB);
        R(a) = ctl[ctl[BLUE_O_CONST] + addr];
    }
    g_pc += 1u;
    return CONTINUE;
}

uint execDivide(uint op, uint a, uint b, uint c) {
    uint x = R(b), y = R(c);
    if (y == 0u) return fault(BLUE_FAULT_DIV_ZERO);
    bool overflow = x == 0x80000000u && y == 0xFFFFFFFFu;
    switch (op) {
        case OP_DIVS: R(a) = overflow ? x : uint(int(x) / int(y)); break;
        case OP_REMS: R(a) = overflow ? 0u : uint(int(x) - (int(x) / int(y)) * int(y)); break;
        case OP_DIVU: R(a) = x / y; break;
        default: R(a) = x % y; break;  // REMU
    }
    g_pc += 1u;
    return CONTINUE;
}

uint execCall(uint target) {
    if (g_sp >= ctl[BLUE_H_STACK_DEPTH]) return fault(BLUE_FAULT_STACK_OVERFLOW);
    ctl[ctl[BLUE_O_STACK] + g_id * ctl[BLUE_H_STACK_DEPTH] + g_sp] = g_pc + 1u;
    g_sp += 1u;
    g_pc = target;
    return CONTINUE;
}

uint execRet() {
    if (g_sp == 0u) return fault(BLUE_FAULT_STACK_UNDERFLOW);
    g_sp -= 1u;
    g_pc = ctl[ctl[BLUE_O_STACK] + g_id * ctl[BLUE_H_STACK_DEPTH] + g_sp];
    return CONTINUE;
}

uint execAlloc(uint a, uint b) {
    uint n = R(b), bump = ctl[BLUE_C_BUMP];
    for (;;) {
        if (n > ctl[BLUE_H_HEAP_WORDS] - bump) {
            R(a) = 0xFFFFFFFFu;
            break;
        }
        uint prev = atomicCompSwap(ctl[BLUE_C_BUMP], bump, bump + n);
        if (prev == bump) {
            R(a) = bump;
            break;
        }
        bump = prev;
    }
    g_pc += 1u;
    return CONTINUE;
}

uint step() {
    if (g_pc >= ctl[BLUE_H_CODE_WORDS] / 2u) return fault(BLUE_FAULT_PC_OOB);
    uint code = ctl[BLUE_O_CODE] + g_pc * 2u;
    uint w0 = ctl[code], imm = ctl[code + 1u];
    uint op = w0 & 0xFFu, a = (w0 >> 8) & 0xFFu, b = (w0 >> 16) & 0xFFu, c = w0 >> 24;
    uint br = branch(op, R(a), R(b));
    if (br != 0u) {
        g_pc = br == 2u ? imm : g_pc + 1u;
        return CONTINUE;
    }
    bool ok;
    uint v = binary(op, R(b), R(c), ok);
    if (!ok) {
        uint base = immBase(op);
        if (base != 0xFFu) v = binary(base, R(b), imm, ok);
    }
    if (!ok) v = unary(op, R(b), ok);
    if (ok) {
        R(a) = v;
        g_pc += 1u;
        return CONTINUE;
    }
    uint kind = outputKind(op);
    if (kind != 0u) {
        if (!emit(kind, op == OP_OUTS ? imm : R(a))) return STOP;  // ring full: retry
        g_pc += 1u;
        return CONTINUE;
    }
    uint result = CONTINUE;
    switch (op) {
        case OP_NOP: g_pc += 1u; break;
        case OP_HALT: g_status = BLUE_ST_HALTED; result = STOP; break;
        case OP_YIELD: g_pc += 1u; result = STOP; break;
        case OP_JMP: g_pc = imm; break;
        case OP_CALL: result = execCall(imm); break;
        case OP_RET: result = execRet(); break;
        case OP_RUN: result = execRun(imm, a); break;
        case OP_LI:
        case OP_LF: R(a) = imm; g_pc += 1u; break;
        case OP_DIVS: case OP_DIVU: case OP_REMS: case OP_REMU: result = execDivide(op, a, b, c); break;
        case OP_IID: R(a) = g_id; g_pc += 1u; break;
        case OP_NINST: R(a) = ctl[BLUE_H_NINST]; g_pc += 1u; break;
        case OP_CYCLE: R(a) = ctl[BLUE_C_CYCLE]; g_pc += 1u; break;
        case OP_LD: case OP_ST: case OP_LDG: case OP_STG: case OP_LDK:
            result = execMemory(op, a, b, imm);
            break;
        case OP_ATOMADD: case OP_ATOMXCHG: case OP_ATOMMAXS: case OP_ATOMMINS: case OP_ATOMCAS:
            result = execAtomic(op, a, b, c);
            break;
        case OP_ALLOC: result = execAlloc(a, b); break;
        case OP_TLD: case OP_TST: result = execTensorWord(op, a, b, imm); break;
        case OP_SEND: case OP_RECV: result = execMailbox(op, a, b); break;
        case OP_INRECV: case OP_INLEN: case OP_INLD: case OP_INCPY: case OP_INFREE:
            result = execInput(op, a, b, c);
            break;
        default: result = fault(BLUE_FAULT_BAD_OPCODE); break;
    }
    return result;
}

void main() {
    g_id = gl_GlobalInvocationID.x;
    bool live = false;
    if (g_id < ctl[BLUE_H_NINST]) {
        g_state = ctl[BLUE_O_STATE] + g_id * BLUE_STATE_WORDS;
        g_status = ctl[g_state + BLUE_S_STATUS];
        live = g_status == BLUE_ST_RUNNING || g_status == BLUE_ST_PARKED;
    }
    uint n_live = subgroupBallotBitCount(subgroupBallot(live));
    if (subgroupElect() && n_live > 0u) atomicAdd(ctl[BLUE_C_LIVE_ACC], n_live);
    if (!live) return;

    g_status = BLUE_ST_RUNNING;
    g_regs = ctl[BLUE_O_REGS] + g_id * ctl[BLUE_H_NREGS];
    g_pc = ctl[g_state + BLUE_S_PC];
    g_fault = BLUE_FAULT_NONE;
    g_sp = ctl[g_state + BLUE_S_SP];
    uint max_steps = ctl[BLUE_H_MAX_STEPS];
    uint steps = 0u;
    while (steps < max_steps) {
        ++steps;
        if (step() == STOP) break;
    }
    ctl[g_state + BLUE_S_PC] = g_pc;
    ctl[g_state + BLUE_S_STATUS] = g_status;
    ctl[g_state + BLUE_S_FAULT] = g_fault;
    ctl[g_state + BLUE_S_SP] = g_sp;
    uint lo = ctl[g_state + BLUE_S_STEPS_LO];
    ctl[g_state + BLUE_S_STEPS_LO] = lo + steps;
    ctl[g_state + BLUE_S_STEPS_HI] += uint(lo + steps < lo);
}
