#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// The sequencer: interprets Blue-IR control code on the GPU, one invocation per instance. Each
// live instance runs until it parks on a block (RUN), yields, halts, faults or has run max_steps
// instructions. Semantics are those of the reference machine (vm/interp.cpp), case for case.
//
// Shape: SIMD devices (and lavapipe, which runs every branch of divergent code with masks) pay
// for all the code inside the step loop on every step. So the hot loop holds only the fast ops
// (ALU, compares, floats, branches, local memory), and everything else (faults, atomics, I/O,
// mailboxes, blocks, calls) runs in slowStep, once per slow instruction, outside that loop.
// BLUE_NO_SUBGROUPS builds the variant for devices without subgroup ballot in compute
// ("sequencer_noballot", chosen by host/pipelines.cpp): it counts live instances with one atomic
// add per live invocation instead of one per subgroup.
#ifndef BLUE_NO_SUBGROUPS
#extension GL_KHR_shader_subgroup_ballot : require
#endif
#define BLUE_CONTROL_COHERENT coherent
#include "common/bindings.glsl"
#include "opcodes.glsl"

layout(local_size_x = BLUE_SEQ_WG) in;

// INCMP and INCPY walk their words SEQ_COPY_UNROLL at a time: lavapipe ends every loop of an
// invocation after 65,535 iterations in all, which one at a time a prompt near 32k tokens
// (compared, then copied) reached in one cycle. INTCPY stays one word an iteration: its store
// goes through pageAccess's switch, and eight copies of it made the GPU-assisted validation
// layer's instrumented sequencer about ten times slower to run, and one page switch around a
// loop of 16-byte stores 30 times. So the generation program copies a large automaton in a cycle
// of its own, all instances together, and the host bounds its size (maxGrammarWords).
#define SEQ_COPY_UNROLL 8u

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

uint outputKind(uint op) {
    switch (op) {
        case OP_OUT: return BLUE_OUT_INT;
        case OP_OUTU: return BLUE_OUT_UINT;
        case OP_OUTF: return BLUE_OUT_FLOAT;
        case OP_OUTC: return BLUE_OUT_CHAR;
        case OP_OUTS: return BLUE_OUT_STR;
        case OP_OUTT: return BLUE_OUT_TOKEN;
        case OP_OUTEND: return BLUE_OUT_END;
        case OP_OUTBEGIN: return BLUE_OUT_BEGIN;
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
    if (op == OP_INPEEK) {
        uint claimed = ctl[BLUE_C_IN_CLAIM];
        if (claimed < ctl[BLUE_C_IN_PUBLISHED]) {
            R(a) = io[ctl[BLUE_H_IO_ORDER] + claimed % ctl[BLUE_H_IN_SLOTS]];
        } else {
            R(a) = ctl[BLUE_C_IN_CLOSED] != 0u ? 0xFFFFFFFFu : 0xFFFFFFFEu;
        }
    } else if (op == OP_INRECV || op == OP_INPOLL) {
        uint claimed = ctl[BLUE_C_IN_CLAIM];
        for (;;) {
            if (claimed >= ctl[BLUE_C_IN_PUBLISHED]) {
                if (ctl[BLUE_C_IN_CLOSED] == 0u) {
                    if (op == OP_INRECV) return STOP;  // wait for input
                    R(a) = 0xFFFFFFFEu;                // INPOLL: nothing now
                    break;
                }
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
    } else if (op == OP_INFLAG) {
        R(a) = R(b) < ctl[BLUE_H_NINST] ? io[ctl[BLUE_H_IO_FLAGS] + R(b)] : 0u;
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
        } else if (op == OP_INCMP) {
            uint start = R(c), at = R(a), lw = ctl[BLUE_H_LOCAL_WORDS];
            if (start > len) return fault(BLUE_FAULT_INPUT_OOB);
            if (at > lw) return fault(BLUE_FAULT_LOCAL_OOB);
            uint n = min(len - start, lw - at), local = ctl[BLUE_O_LOCAL] + g_id * lw + at, i = 0u;
            bool same = true;
            for (uint i0 = 0u; i0 < n && same; i0 += SEQ_COPY_UNROLL) {
                [[unroll]] for (uint k = 0u; k < SEQ_COPY_UNROLL; ++k) {
                    if (same && i0 + k < n && ctl[local + i0 + k] == io[msg + 1u + start + i0 + k]) {
                        i = i0 + k + 1u;
                    } else {
                        same = false;
                    }
                }
            }
            R(a) = i;
        } else {  // INCPY
            uint start = R(c), dst = R(a), lw = ctl[BLUE_H_LOCAL_WORDS];
            if (start > len) return fault(BLUE_FAULT_INPUT_OOB);
            uint n = len - start;
            if (dst > lw || n > lw - dst) return fault(BLUE_FAULT_LOCAL_OOB);
            uint local = ctl[BLUE_O_LOCAL] + g_id * lw + dst;
            for (uint i0 = 0u; i0 < n; i0 += SEQ_COPY_UNROLL) {
                [[unroll]] for (uint k = 0u; k < SEQ_COPY_UNROLL; ++k) {
                    if (i0 + k < n) ctl[local + i0 + k] = io[msg + 1u + start + i0 + k];
                }
            }
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

// HASHL, HCMPL, HCPYL: at most BLUE_MAX_WALK (8) words of local memory from R(b), hashed into
// R(a) or compared with / copied to the heap from R(a). Unrolled whole: no loop, so a cycle of
// walks spends none of lavapipe's loop iterations (maxCycleSteps), and a walk is one step.
uint execWalk(uint op, uint a, uint b, uint c) {
    uint n = R(c), at = R(b), lw = ctl[BLUE_H_LOCAL_WORDS];
    if (n > BLUE_MAX_WALK) return fault(BLUE_FAULT_WALK);
    if (at > lw || n > lw - at) return fault(BLUE_FAULT_LOCAL_OOB);
    uint hw = R(a), heap_words = ctl[BLUE_H_HEAP_WORDS];
    if (op != OP_HASHL && (hw > heap_words || n > heap_words - hw)) return fault(BLUE_FAULT_HEAP_OOB);
    uint local = ctl[BLUE_O_LOCAL] + g_id * lw + at, heap = ctl[BLUE_O_HEAP] + hw;
    uint v = op == OP_HASHL ? hw : 0u;
    bool equal = true;
    [[unroll]] for (uint k = 0u; k < BLUE_MAX_WALK; ++k) {
        if (k < n) {
            uint w = ctl[local + k];
            if (op == OP_HASHL) {
                v = (v ^ w) * 16777619u;
            } else if (op == OP_HCPYL) {
                ctl[heap + k] = w;
            } else if (equal && ctl[heap + k] == w) {
                v = k + 1u;
            } else {
                equal = false;
            }
        }
    }
    if (op != OP_HCPYL) R(a) = v;
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

// INTCPY: a length-prefixed section of input slot R(b) at word R(a) into tensor t's slice.
uint execTensorCopy(uint a, uint b, uint t) {
    uint s = R(b);
    if (!slotValid(s)) return fault(BLUE_FAULT_INPUT_OOB);
    uint msg = ctl[BLUE_H_IO_SLOTS] + s * ctl[BLUE_H_IN_SLOT_WORDS];
    uint len = io[msg], at = R(a);
    if (at >= len) return fault(BLUE_FAULT_INPUT_OOB);
    uint n = io[msg + 1u + at];
    if (n > len - at - 1u) return fault(BLUE_FAULT_INPUT_OOB);
    uint ref = ctl[BLUE_O_TENSORS] + t * BLUE_TREF_WORDS;
    if (n > ctl[ref + 3u]) return fault(BLUE_FAULT_TENSOR_OOB);
    uint page = ctl[ref] & 0xFFFFu;
    uint cls = ctl[ref] >> 16;
    uint w = (ctl[ref + 1u] + (cls == BLUE_TC_INSTANCE ? g_id * ctl[ref + 2u] : 0u)) / 4u;
    for (uint i = 0u; i < n; ++i) pageStore(page, w + i, io[msg + 2u + at + i]);
    R(a) = at + 1u + n;
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

// Executes a fast instruction and returns true, or returns false (nothing done) for an
// instruction that needs slowStep: a slow opcode, or a fast one that would fault.
bool fastStep(uint op, uint a, uint b, uint c, uint imm, uint local_base, uint local_words) {
    uint ra = R(a), x = R(b), y = R(c);
    uint v = 0u;
    uint npc = g_pc + 1u;
    bool write = true;
    switch (op) {
        case OP_NOP: write = false; break;
        case OP_JMP: write = false; npc = imm; break;
        case OP_BEQZ: write = false; if (ra == 0u) npc = imm; break;
        case OP_BNEZ: write = false; if (ra != 0u) npc = imm; break;
        case OP_BEQ: write = false; if (ra == x) npc = imm; break;
        case OP_BNE: write = false; if (ra != x) npc = imm; break;
        case OP_BLTS: write = false; if (int(ra) < int(x)) npc = imm; break;
        case OP_BGES: write = false; if (int(ra) >= int(x)) npc = imm; break;
        case OP_BLTU: write = false; if (ra < x) npc = imm; break;
        case OP_BGEU: write = false; if (ra >= x) npc = imm; break;
        case OP_MOV: v = x; break;
        case OP_LI: case OP_LF: v = imm; break;
        case OP_ADD: v = x + y; break;
        case OP_SUB: v = x - y; break;
        case OP_MUL: v = x * y; break;
        case OP_AND: v = x & y; break;
        case OP_OR: v = x | y; break;
        case OP_XOR: v = x ^ y; break;
        case OP_SHL: v = x << (y & 31u); break;
        case OP_SHRL: v = x >> (y & 31u); break;
        case OP_SHRA: v = uint(int(x) >> int(y & 31u)); break;
        case OP_MINS: v = uint(min(int(x), int(y))); break;
        case OP_MAXS: v = uint(max(int(x), int(y))); break;
        case OP_MINU: v = min(x, y); break;
        case OP_MAXU: v = max(x, y); break;
        case OP_ADDI: v = x + imm; break;
        case OP_MULI: v = x * imm; break;
        case OP_ANDI: v = x & imm; break;
        case OP_ORI: v = x | imm; break;
        case OP_XORI: v = x ^ imm; break;
        case OP_SHLI: v = x << (imm & 31u); break;
        case OP_SHRLI: v = x >> (imm & 31u); break;
        case OP_SHRAI: v = uint(int(x) >> int(imm & 31u)); break;
        case OP_SEQ: v = uint(x == y); break;
        case OP_SNE: v = uint(x != y); break;
        case OP_SLTS: v = uint(int(x) < int(y)); break;
        case OP_SLES: v = uint(int(x) <= int(y)); break;
        case OP_SLTU: v = uint(x < y); break;
        case OP_SLEU: v = uint(x <= y); break;
        case OP_SEQI: v = uint(x == imm); break;
        case OP_SLTSI: v = uint(int(x) < int(imm)); break;
        case OP_FEQ: v = uint(asF(x) == asF(y)); break;
        case OP_FLT: v = uint(asF(x) < asF(y)); break;
        case OP_FLE: v = uint(asF(x) <= asF(y)); break;
        case OP_FADD: v = asU(asF(x) + asF(y)); break;
        case OP_FSUB: v = asU(asF(x) - asF(y)); break;
        case OP_FMUL: v = asU(asF(x) * asF(y)); break;
        case OP_FDIV: v = asU(asF(x) / asF(y)); break;
        case OP_FMIN: v = asU(fminNan(asF(x), asF(y))); break;
        case OP_FMAX: v = asU(fmaxNan(asF(x), asF(y))); break;
        case OP_FNEG: v = x ^ 0x80000000u; break;
        case OP_FABS: v = x & 0x7FFFFFFFu; break;
        case OP_FSQRT: v = asU(sqrt(asF(x))); break;
        case OP_FEXP: v = asU(exp(asF(x))); break;
        case OP_FLOG: v = asU(log(asF(x))); break;
        case OP_FFLOOR: {
            // A zero result keeps the operand's sign (floor(-0) = -0): llvmpipe's 512-bit floor
            // (LP_NATIVE_VECTOR_WIDTH=512) returned +0 for -0.
            float r = floor(asF(x));
            v = r == 0.0 ? x & 0x80000000u : asU(r);
            break;
        }
        case OP_ITOF: v = asU(float(int(x))); break;
        case OP_UTOF: v = asU(float(x)); break;
        case OP_FTOI: v = floatToInt(asF(x)); break;
        case OP_IID: v = g_id; break;
        case OP_NINST: v = ctl[BLUE_H_NINST]; break;
        case OP_CYCLE: v = ctl[BLUE_C_CYCLE]; break;
        case OP_LD:
            if (x + imm >= local_words) return false;  // faults in slowStep
            v = ctl[local_base + x + imm];
            break;
        case OP_ST:
            if (x + imm >= local_words) return false;
            write = false;
            ctl[local_base + x + imm] = ra;
            break;
        default: return false;
    }
    if (write) R(a) = v;
    g_pc = npc;
    return true;
}

// Everything fastStep declines, with the reference machine's full semantics.
uint slowStep(uint op, uint a, uint b, uint c, uint imm) {
    if (g_pc >= ctl[BLUE_H_CODE_WORDS] / 2u) return fault(BLUE_FAULT_PC_OOB);
    uint kind = outputKind(op);
    if (kind != 0u) {
        if (!emit(kind, op == OP_OUTS ? imm : R(a))) return STOP;  // ring full: retry
        g_pc += 1u;
        return CONTINUE;
    }
    uint result = CONTINUE;
    switch (op) {
        case OP_HALT: g_status = BLUE_ST_HALTED; result = STOP; break;
        case OP_YIELD: g_pc += 1u; result = STOP; break;
        case OP_CALL: result = execCall(imm); break;
        case OP_RET: result = execRet(); break;
        case OP_RUN: result = execRun(imm, a); break;
        case OP_DIVS: case OP_DIVU: case OP_REMS: case OP_REMU: result = execDivide(op, a, b, c); break;
        case OP_LD: case OP_ST: case OP_LDG: case OP_STG: case OP_LDK:
            result = execMemory(op, a, b, imm);
            break;
        case OP_ATOMADD: case OP_ATOMXCHG: case OP_ATOMMAXS: case OP_ATOMMINS: case OP_ATOMCAS:
            result = execAtomic(op, a, b, c);
            break;
        case OP_ALLOC: result = execAlloc(a, b); break;
        case OP_TLD: case OP_TST: result = execTensorWord(op, a, b, imm); break;
        case OP_INTCPY: result = execTensorCopy(a, b, imm); break;
        case OP_HASHL: case OP_HCMPL: case OP_HCPYL: result = execWalk(op, a, b, c); break;
        case OP_SEND: case OP_RECV: result = execMailbox(op, a, b); break;
        case OP_INRECV: case OP_INPOLL: case OP_INPEEK: case OP_INLEN: case OP_INLD: case OP_INCPY: case OP_INCMP: case OP_INFREE: case OP_INFLAG:
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
#ifdef BLUE_NO_SUBGROUPS
    if (live) atomicAdd(ctl[BLUE_C_LIVE_ACC], 1u);
#else
    uint n_live = subgroupBallotBitCount(subgroupBallot(live));
    if (subgroupElect() && n_live > 0u) atomicAdd(ctl[BLUE_C_LIVE_ACC], n_live);
#endif
    if (!live) return;

    g_status = BLUE_ST_RUNNING;
    g_regs = ctl[BLUE_O_REGS] + g_id * ctl[BLUE_H_NREGS];
    g_pc = ctl[g_state + BLUE_S_PC];
    g_fault = BLUE_FAULT_NONE;
    g_sp = ctl[g_state + BLUE_S_SP];
    uint max_steps = ctl[BLUE_H_MAX_STEPS];
    uint ncode = ctl[BLUE_H_CODE_WORDS] / 2u;
    uint code = ctl[BLUE_O_CODE];
    uint local_words = ctl[BLUE_H_LOCAL_WORDS];
    uint local_base = ctl[BLUE_O_LOCAL] + g_id * local_words;
    uint steps = 0u;
    while (steps < max_steps) {
        uint op = 0u, a = 0u, b = 0u, c = 0u, imm = 0u;
        bool slow = false;
        while (steps < max_steps) {  // the hot loop: fast instructions only
            ++steps;
            if (g_pc >= ncode) {
                slow = true;
                break;
            }
            uint w0 = ctl[code + g_pc * 2u];
            imm = ctl[code + g_pc * 2u + 1u];
            op = w0 & 0xFFu;
            a = (w0 >> 8) & 0xFFu;
            b = (w0 >> 16) & 0xFFu;
            c = w0 >> 24;
            if (!fastStep(op, a, b, c, imm, local_base, local_words)) {
                slow = true;
                break;
            }
        }
        if (!slow) break;  // step budget used up: continue next cycle
        if (slowStep(op, a, b, c, imm) == STOP) break;
    }
    ctl[g_state + BLUE_S_PC] = g_pc;
    ctl[g_state + BLUE_S_STATUS] = g_status;
    ctl[g_state + BLUE_S_FAULT] = g_fault;
    ctl[g_state + BLUE_S_SP] = g_sp;
    uint lo = ctl[g_state + BLUE_S_STEPS_LO];
    ctl[g_state + BLUE_S_STEPS_LO] = lo + steps;
    ctl[g_state + BLUE_S_STEPS_HI] += uint(lo + steps < lo);
}
