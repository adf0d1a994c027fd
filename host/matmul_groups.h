// MATMULs over one x run as one dispatch: a layer's Q, K and V projections (and any other run of
// MATMULs that read the same x) become one matmul over their matrices stacked by rows.
//
// Nothing in the module changes; planPages places the members so that the stack exists in memory:
//   - the matrices back to back in one page. The GPU weight layout (host/weight_layout.h) keeps
//     rows in groups of 8, so matrices of whole groups, of one type and K, concatenate into the
//     layout of the stacked [K, N1 + N2 + ...] matrix;
//   - the destinations interleaved: each row (or instance slice) of the fused output holds the
//     members' rows side by side, and each member is a view of it (its own offset within the row,
//     the fused row's stride). Kernels address every operand through its slice stride
//     (common/tensor.glsl sliceOffset), so the members stay ordinary tensors to every op that
//     reads them.
// planDispatches then gives the group's first MATMUL the stacked operands and drops the others.
// Every row is summed as before (the same kernels, the same order over K), so outputs do not
// change: only the dispatches fewer.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "vm/module.h"

namespace blue {

struct MatmulGroup {
    std::vector<uint32_t> weights;  // the members' matrices, in instruction order
    std::vector<uint32_t> dsts;     // their destinations
    // The destinations' row: dsts, or a longer row of which they are consecutive members (a layer
    // whose V has another type stacks Q and K into the row other layers' Q, K and V share).
    std::vector<uint32_t> row;
    // Where the group runs: (block, index of its first MATMUL among the block's tensor
    // instructions). One stack may run in several blocks (a model's forward, verify and score).
    std::vector<std::pair<uint32_t, uint32_t>> runs;
};

// The groups a module offers: runs of two or more consecutive plain MATMULs in a block that read
// one x, whose matrices are 2-D WEIGHT tensors of one type (with a GPU layout) and one K with rows
// in whole groups of 8 and appear in no other group, and whose destinations are F32 tensors of one
// class (ROWS or INSTANCE), distinct from x, written or read only by ops whose kernels address them
// by slice (the MATMULs, ROPE, ROPEQK, KVSTORE, KVSTOREP, ATTN, ATTNX, ATTNP, TADD, TMUL, TSCALE,
// RMSNORM). Runs that share destinations share their row layout; a run that does not fit the
// row it would share is left out. Placement may still decline a group (planPages: it must fit a
// page, unsplit).
std::vector<MatmulGroup> findMatmulGroups(const Module& m);

}  // namespace blue
