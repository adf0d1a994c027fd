#version 450
#extension GL_GOOGLE_include_directive : require
// The plan: runs once per cycle between the sequencer and the blocks. It publishes the rows and
// instances each block collected this cycle, resets the accumulators for the next cycle, writes
// the indirect arguments of every tensor dispatch (zero groups where nobody asked) and of the
// next cycle's sequencer (zero groups once no instance is live or the cycle limit is reached).
// One workgroup of BLUE_PLAN_WG lanes: blocks, then dispatches, a lane each in turn (a single
// invocation walking ~500 dispatches took 236 us per cycle on an NVIDIA H100, each step waiting
// on its loads). Lanes read the block counts other lanes wrote: the control buffer is coherent.
#define BLUE_CONTROL_COHERENT coherent
#include "common/bindings.glsl"

layout(local_size_x = BLUE_PLAN_WG) in;

void writeIndirect(uint index, uint x, uint y) {
    uint at = ctl[BLUE_O_INDIRECT] + index * 3u;
    bool none = x == 0u || y == 0u;
    ctl[at] = none ? 0u : x;
    ctl[at + 1u] = none ? 0u : y;
    ctl[at + 2u] = none ? 0u : 1u;
}

void main() {
    const uint lid = gl_LocalInvocationID.x;
    uint nblocks = ctl[BLUE_H_NBLOCKS];
    uint runs = 0u;
    for (uint b = lid; b < nblocks; b += BLUE_PLAN_WG) {
        uint blk = ctl[BLUE_O_BLOCKS] + b * BLUE_BLOCK_WORDS;
        uint insts = ctl[blk + BLUE_B_ACC_INSTS];
        ctl[blk + BLUE_B_ROWS] = ctl[blk + BLUE_B_ACC_ROWS];
        ctl[blk + BLUE_B_INSTS] = insts;
        ctl[blk + BLUE_B_ACC_ROWS] = 0u;
        ctl[blk + BLUE_B_ACC_INSTS] = 0u;
        if (insts > 0u) runs += 1u;
    }
    if (runs > 0u) atomicAdd(ctl[BLUE_C_BLOCK_RUNS], runs);
    // The blocks' published counts, for every lane's dispatches.
    memoryBarrierBuffer();
    barrier();
    uint ndispatch = ctl[BLUE_H_NDISPATCH];
    for (uint d = lid; d < ndispatch; d += BLUE_PLAN_WG) {
        uint desc = ctl[BLUE_O_DISPATCH] + d * BLUE_DISPATCH_WORDS;
        uint blk = ctl[BLUE_O_BLOCKS] + ctl[desc + BLUE_D_BLOCK] * BLUE_BLOCK_WORDS;
        uint items = ctl[blk + (ctl[desc + BLUE_D_MODE] == 0u ? BLUE_B_ROWS : BLUE_B_INSTS)];
        uint tile = ctl[desc + BLUE_D_TILE];
        uint range = ctl[desc + BLUE_D_RANGE];
        uint lo = range & 0xFFFFu, hi = range >> 16;
        uint groups = (items < lo || (hi != 0u && items > hi)) ? 0u : (items + tile - 1u) / tile;
        uint fixed_groups = ctl[desc + BLUE_D_FIXED];
        if (ctl[desc + BLUE_D_AXIS] == 0u) {
            writeIndirect(d, fixed_groups, groups);
        } else {
            writeIndirect(d, groups, fixed_groups);
        }
    }
    if (lid != 0u) return;
    // The sequencer's own arguments sit after the tensor dispatches'.
    uint seq = ctl[BLUE_O_INDIRECT] + ndispatch * 3u;
    bool seq_ran = ctl[seq] != 0u;
    if (seq_ran) {
        uint live = ctl[BLUE_C_LIVE_ACC];
        ctl[BLUE_C_LIVE] = live;
        ctl[BLUE_C_LIVE_ACC] = 0u;
        if (live > 0u) ctl[BLUE_C_CYCLE] += 1u;
    }
    bool more = ctl[BLUE_C_LIVE] > 0u && ctl[BLUE_C_CYCLE] < ctl[BLUE_H_MAX_CYCLES];
    uint groups = (ctl[BLUE_H_NINST] + BLUE_SEQ_WG - 1u) / BLUE_SEQ_WG;
    writeIndirect(ndispatch, more ? groups : 0u, 1u);
}
