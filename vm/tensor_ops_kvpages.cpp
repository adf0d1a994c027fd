// Rules and reference semantics of the paged-KV tensor ops (vm/opcodes.def): KVSTOREP, ATTNP,
// PGCOPY and KVCOPYP. Their K and V rows live in per-layer pools, GLOBAL [D, PS, NP] (F32 or F16;
// PS positions a page, a power of two in [8, 32]; NP pages), which every instance reads through
// its own page table: the U_n words local[U_tab ..] of its local memory, one page id per PS
// positions. Position p lives in pool row pt[p / PS] * PS + p % PS; an entry >= NP leaves its
// positions unmapped. The table comes from untrusted memory, so every entry is checked where it
// is read; U_tab and U_n are constants that the verifier checks against the layout.
#include <algorithm>
#include <cstring>

#include "vm/tensor_ops_internal.h"

namespace blue {

namespace {

// ---- checks ------------------------------------------------------------------------------------

// A pool of rows of `row` elements: GLOBAL, F32 or F16, [row, PS, NP] with PS a power of two in
// [8, 32] (so a page's positions are a shift and a mask, and a page's tokens a short walk), and
// whole 32-bit words per F16 row (the kernels store and copy words).
Status poolTensor(const Checker& c, size_t i, uint64_t row) {
    const TensorDecl& t = c.t(i);
    if (t.cls != BLUE_TC_GLOBAL) return c.fail(i, "a KV pool must be a GLOBAL tensor");
    if (t.dtype != DType::F32 && t.dtype != DType::F16)
        return c.fail(i, "a KV pool must be F32 or F16");
    if (t.ndim != 3 || t.ne[0] != row) {
        return c.fail(i, strFormat("a KV pool must be [%llu, PS, NP]", (unsigned long long)row));
    }
    const uint64_t ps = t.ne[1];
    if (ps < 8 || ps > 32 || (ps & (ps - 1)) != 0) {
        return c.fail(i, strFormat("a page of %llu positions; pages hold 8, 16 or 32",
                                   (unsigned long long)ps));
    }
    if (t.dtype == DType::F16 && row % 2) {
        return c.fail(i, strFormat("an F16 pool needs an even row length, not %llu",
                                   (unsigned long long)row));
    }
    return Status::ok();
}

// The kernels are built per pool type (of the K pool) and take PS and NP from it.
Status samePools(const Checker& c, size_t k, size_t v) {
    for (int d = 0; d < 3; ++d) {
        if (c.t(k).ne[d] != c.t(v).ne[d]) return c.fail(v, "K and V pools differ in shape");
    }
    if (c.t(k).dtype != c.t(v).dtype) return c.fail(v, "K and V pools differ in type");
    return Status::ok();
}

// The page table's operands at `at` (U_tab) and at + 1 (U_n): at least one entry, no more than
// the pool's pages (a table past them could map a page twice, and it would let a small pool stand
// for a long context: the reference's attention walks every position the table covers), all
// within an instance's local memory.
Status pageTable(const Checker& c, size_t at, size_t pool) {
    const uint64_t tab = c.ti.args[at], n = c.ti.args[at + 1], pages = c.t(pool).ne[2];
    if (n == 0) return BLUE_ERROR("the page table has no entries (U_n is 0)");
    if (n > pages) {
        return BLUE_ERROR("the page table has %llu entries, more than the pool's %llu pages",
                          (unsigned long long)n, (unsigned long long)pages);
    }
    if (tab + n > c.m.layout.local_words) {
        return BLUE_ERROR(
            "the page table local[%llu .. %llu) passes the %u local words of an instance",
            (unsigned long long)tab, (unsigned long long)(tab + n), c.m.layout.local_words);
    }
    return Status::ok();
}

Status checkKvstorep(const Checker& c) {
    BLUE_TRY(rowsDst(c, 0));
    BLUE_TRY(rowsDst(c, 2));
    BLUE_TRY(c.elements(2, c.t(0).elements()));
    BLUE_TRY(poolTensor(c, 1, c.t(0).elements()));
    BLUE_TRY(poolTensor(c, 3, c.t(0).elements()));
    BLUE_TRY(samePools(c, 1, 3));
    BLUE_TRY(argSlot(c.ti.args[4]));
    return pageTable(c, 5, 1);
}

Status checkAttnp(const Checker& c) {
    uint64_t kv_row = 0;
    BLUE_TRY(checkAttnQuery(c, &kv_row));
    BLUE_TRY(poolTensor(c, 1, kv_row));
    BLUE_TRY(poolTensor(c, 2, kv_row));
    BLUE_TRY(samePools(c, 1, 2));
    BLUE_TRY(argSlot(c.ti.args[6]));
    return pageTable(c, 10, 1);
}

Status checkPgcopy(const Checker& c) {
    BLUE_TRY(poolTensor(c, 0, c.t(0).ne[0]));
    for (size_t k : {1, 2, 3}) BLUE_TRY(argSlot(c.ti.args[k]));
    return Status::ok();
}

// KVCOPYP: a pool and a session store of the same row width and type (the store's context is its
// own: rows past it are not copied, positions past the table are unmapped).
Status checkKvcopyp(const Checker& c) {
    BLUE_TRY(poolTensor(c, 0, c.t(0).ne[0]));
    const TensorDecl& s = c.t(1);
    if (s.cls != BLUE_TC_GLOBAL || s.ndim != 3)
        return c.fail(1, "the store must be a GLOBAL tensor [D, ctx, slots]");
    if (c.ti.args[0] == c.ti.args[1]) return c.fail(1, "the store must not be the pool");
    if (s.ne[0] != c.t(0).ne[0]) return c.fail(1, "the store's rows differ from the pool's");
    BLUE_TRY(c.dtype(1, c.t(0).dtype));
    if (c.ti.args[2] > 1)
        return BLUE_ERROR("copy direction %u is not 0 (store to pool) or 1 (pool to store)",
                          c.ti.args[2]);
    for (size_t k : {3, 4, 5}) BLUE_TRY(argSlot(c.ti.args[k]));
    return pageTable(c, 6, 0);
}

// ---- reference implementations ---------------------------------------------------------------

// The pool row of position p of the item's instance through the table at local[tab .. tab + n)
// of a pool of PS = page positions and NP = pages; kNoKvRow when unmapped.
uint64_t pageRow(const Items& it, uint32_t item, uint32_t tab, uint32_t n, const TensorDecl& pool,
                 uint64_t p) {
    const uint64_t ps = pool.ne[1], np = pool.ne[2];
    if (p / ps >= n) return kNoKvRow;
    const uint32_t* entry = it.local(item, uint64_t(tab) + p / ps);
    if (!entry || *entry >= np) return kNoKvRow;
    return uint64_t(*entry) * ps + p % ps;
}

void refKvstorep(const Items& it, const TensorInstr& ti) {
    const TensorDecl& kp = it.decl(ti.args[1]);
    const uint32_t tab = ti.args[5], n = ti.args[6];
    kvStoreRows(it, ti, [&](uint32_t item, uint64_t p) { return pageRow(it, item, tab, n, kp, p); });
}

void refAttnp(const Items& it, const TensorInstr& ti) {
    const TensorDecl& kp = it.decl(ti.args[1]);
    const uint32_t tab = ti.args[10], n = ti.args[11];
    attnRows(it, ti, uint64_t(n) * kp.ne[1],
             [&](uint32_t item, uint64_t t) { return pageRow(it, item, tab, n, kp, t); });
}

void refPgcopy(const Items& it, const TensorInstr& ti) {
    const TensorDecl& pool = it.decl(ti.args[0]);
    const uint64_t ps = pool.ne[1], np = pool.ne[2];
    const uint64_t row_bytes = *dtypeRowBytes(pool.dtype, pool.ne[0]), page_bytes = row_bytes * ps;
    for (uint32_t item = 0; item < it.count(); ++item) {
        const uint64_t src = it.arg(item, ti.args[1]), dst = it.arg(item, ti.args[2]);
        const uint64_t rows = std::min<uint64_t>(it.arg(item, ti.args[3]), ps);
        if (src >= np || dst >= np || src == dst) continue;
        uint8_t* base = it.slice(ti.args[0], item);
        std::memcpy(base + dst * page_bytes, base + src * page_bytes, rows * row_bytes);
    }
}

void refKvcopyp(const Items& it, const TensorInstr& ti) {
    const TensorDecl& pool = it.decl(ti.args[0]);
    const uint32_t tab = ti.args[6], n = ti.args[7];
    kvCopyRows(it, ti, [&](uint32_t item, uint64_t pos) { return pageRow(it, item, tab, n, pool, pos); });
}

}  // namespace

Status checkKvPagesOp(const Checker& c) {
    switch (c.ti.op) {
        case Op::KVSTOREP:
            return checkKvstorep(c);
        case Op::ATTNP:
            return checkAttnp(c);
        case Op::PGCOPY:
            return checkPgcopy(c);
        case Op::KVCOPYP:
            return checkKvcopyp(c);
        default:
            break;
    }
    return BLUE_ERROR("no rules for tensor op 0x%02x", uint32_t(c.ti.op));
}

bool runKvPagesOpRef(const Items& it, const TensorInstr& ti) {
    switch (ti.op) {
        case Op::KVSTOREP:
            refKvstorep(it, ti);
            return true;
        case Op::ATTNP:
            refAttnp(it, ti);
            return true;
        case Op::PGCOPY:
            refPgcopy(it, ti);
            return true;
        case Op::KVCOPYP:
            refKvcopyp(it, ti);
            return true;
        default:
            return false;
    }
}

}  // namespace blue
