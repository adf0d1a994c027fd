// Byte-addressed reads from u32 pages, for tensors whose rows or blocks are not 4-byte aligned
// (quantized blocks of 18, 34, ... bytes).
uint loadByte(uint page, uint offset) {
    return (page_u[page].d[offset >> 2] >> ((offset & 3u) * 8u)) & 0xFFu;
}
// A little-endian u16 at an even byte offset.
uint loadU16(uint page, uint offset) {
    return (page_u[page].d[offset >> 2] >> ((offset & 2u) * 8u)) & 0xFFFFu;
}
float loadHalf(uint page, uint offset) { return unpackHalf2x16(loadU16(page, offset)).x; }
// A little-endian u32 at any byte offset.
uint loadU32(uint page, uint offset) {
    uint shift = (offset & 3u) * 8u;
    uint lo = page_u[page].d[offset >> 2];
    if (shift == 0u) return lo;
    return (lo >> shift) | (page_u[page].d[(offset >> 2) + 1u] << (32u - shift));
}
// Local memory word of an instance (control buffer).
uint localWord(uint inst, uint addr) {
    return ctl[ctl[BLUE_O_LOCAL] + inst * ctl[BLUE_H_LOCAL_WORDS] + addr];
}
// Paged KV (KVSTOREP, ATTNP, KVCOPYP; vm/tensor_ops_kvpages.cpp pageRow): the pool row of
// position p of an instance through its page table local[tab .. tab + n), in pages of PS
// positions out of NP (push constants BLUE_PC_KVP_*; PS a power of two); KVP_UNMAPPED where the
// position has none (past the table, or an entry >= NP).
#define KVP_UNMAPPED 0xFFFFFFFFu
uint pageRow(uint inst, uint tab, uint n, uint p) {
    uint ps = pc.w[BLUE_PC_KVP_PAGE], np = pc.w[BLUE_PC_KVP_PAGES];
    uint j = p >> uint(findMSB(ps));
    if (j >= n) return KVP_UNMAPPED;
    uint page = localWord(inst, tab + j);
    if (page >= np) return KVP_UNMAPPED;
    return page * ps + (p & (ps - 1u));
}
// A position arg + row index, saturating at 0xFFFFFFFF where the reference's 64-bit sum passes
// 32 bits (past any table).
uint addPositions(uint a, uint b) {
    uint s = a + b;
    return s < a ? 0xFFFFFFFFu : s;
}
// Block argument k of an instance.
uint blockArg(uint inst, uint k) { return ctl[ctl[BLUE_O_BARGS] + inst * BLUE_MAX_BLOCK_ARGS + k]; }
