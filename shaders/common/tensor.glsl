// Helpers for tensor kernels: which items a dispatch runs over and where each operand's slice of
// an item lives. An item is a block row (mode 0) or a participating instance (mode 1); a ROWS
// operand read in instance mode gives the instance's last row, an INSTANCE operand the instance's
// slice, a WEIGHT or GLOBAL operand the whole tensor (broadcast to every item).
#include "common/bindings.glsl"

struct TRef {
    uint page;
    uint cls;
    uint offset;  // bytes
    uint stride;  // bytes per slice
    uint n;       // elements per slice
};

// Tensor reference at push-constant word `at`.
TRef tref(uint at) {
    TRef t;
    t.page = pc.w[at] & 0xFFFFu;
    t.cls = pc.w[at] >> 16;
    t.offset = pc.w[at + 1];
    t.stride = pc.w[at + 2];
    t.n = pc.w[at + 3];
    return t;
}

uint blockBase() { return ctl[BLUE_O_BLOCKS] + pc.w[BLUE_PC_BLOCK] * BLUE_BLOCK_WORDS; }

// Items this dispatch runs over in this cycle.
uint itemCount() {
    return ctl[blockBase() + (pc.w[BLUE_PC_MODE] == 0u ? BLUE_B_ROWS : BLUE_B_INSTS)];
}

// ELEM grids: this invocation's item and element. Items run along y, one a workgroup, or where
// an item needs few lanes BLUE_PC_TILE of them, each on BLUE_ELEM_WG / tile lanes (the plan's
// DispatchDesc::tile, a power of two). For kernels of BLUE_ELEM_WG lanes.
uint elemTile() { return max(pc.w[BLUE_PC_TILE], 1u); }
uint elemItem() {
    return gl_WorkGroupID.y * elemTile() + gl_LocalInvocationID.x / (BLUE_ELEM_WG / elemTile());
}
uint elemIndex() {
    return elemTile() == 1u ? gl_GlobalInvocationID.x : gl_LocalInvocationID.x % (BLUE_ELEM_WG / elemTile());
}

uint listBase() { return ctl[BLUE_O_LISTS] + pc.w[BLUE_PC_BLOCK] * 3u * ctl[BLUE_H_NINST]; }

uint itemInstance(uint item) {
    if (pc.w[BLUE_PC_MODE] == 0u) {
        uint rowmap = ctl[BLUE_O_ROWMAP] + pc.w[BLUE_PC_BLOCK] * ctl[BLUE_H_MAX_ROWS] * 2u;
        return ctl[rowmap + item * 2u];
    }
    return ctl[listBase() + item];
}

uint itemRow(uint item) {
    if (pc.w[BLUE_PC_MODE] == 0u) return item;
    uint n = ctl[BLUE_H_NINST];
    return ctl[listBase() + n + item] + ctl[listBase() + 2u * n + item] - 1u;
}

// Index of the item's row among its instance's rows (instance items: their last row).
uint itemRowLocal(uint item) {
    uint n = ctl[BLUE_H_NINST];
    if (pc.w[BLUE_PC_MODE] == 0u) {
        uint rowmap = ctl[BLUE_O_ROWMAP] + pc.w[BLUE_PC_BLOCK] * ctl[BLUE_H_MAX_ROWS] * 2u;
        return ctl[rowmap + item * 2u + 1u];
    }
    return ctl[listBase() + 2u * n + item] - 1u;
}

// Byte offset of the item's slice of operand t.
uint sliceOffset(TRef t, uint item) {
    if (t.cls == BLUE_TC_ROWS) return t.offset + itemRow(item) * t.stride;
    if (t.cls == BLUE_TC_INSTANCE) return t.offset + itemInstance(item) * t.stride;
    return t.offset;
}
