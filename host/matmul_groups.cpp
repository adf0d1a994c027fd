// Finding the MATMULs that can run as one dispatch (host/matmul_groups.h).
#include "host/matmul_groups.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "host/weight_layout.h"
#include "vm/abi.h"
#include "vm/isa.h"
#include "vm/verify.h"

namespace blue {
namespace {

// Ops whose kernels read and write every tensor operand at sliceOffset(t, item) + i for i < t.n,
// so that a view with another row's stride is an ordinary operand to them.
bool addressesBySlice(Op op, size_t operand) {
    switch (op) {
        case Op::MATMUL:
        case Op::MATMULADD:
        case Op::MATMULGLU:
            return operand != 1;  // the matrix is read in the GPU weight layout
        case Op::ROPE:
        case Op::ROPEQK:
        case Op::KVSTORE:
        case Op::KVSTOREP:
        case Op::ATTN:
        case Op::ATTNX:
        case Op::ATTNP:
        case Op::TADD:
        case Op::TMUL:
        case Op::TSCALE:
        case Op::RMSNORM:
            return true;
        default:
            return false;
    }
}

bool stackable(const TensorDecl& first, const TensorDecl& w) {
    WeightLayout wl;
    return w.cls == BLUE_TC_WEIGHT && w.ndim == 2 && w.dtype == first.dtype && w.ne[0] == first.ne[0] &&
           w.ne[1] % 8 == 0 && weightLayout(w.dtype, w.ne[0], w.ne[1], &wl);
}

bool viewable(const TensorDecl& first, const TensorDecl& d, const TensorDecl& w) {
    return (d.cls == BLUE_TC_ROWS || d.cls == BLUE_TC_INSTANCE) && d.cls == first.cls && d.dtype == DType::F32 &&
           d.ndim == 1 && d.ne[0] == w.ne[1];
}

}  // namespace

std::vector<MatmulGroup> findMatmulGroups(const Module& m) {
    std::vector<std::vector<TensorInstr>> blocks(m.blocks.size());
    // Tensors some op reads or writes other than by slice: never a view.
    std::vector<uint8_t> whole(m.tensors.size(), 0);
    for (size_t b = 0; b < m.blocks.size(); ++b) {
        if (!decodeBlock(m, m.blocks[b], &blocks[b])) return {};
        for (const TensorInstr& ti : blocks[b]) {
            const OpInfo& info = opInfo(ti.op);
            for (size_t k = 0; k < ti.args.size() && k < info.format.size(); ++k) {
                const char letter = info.format[k];
                if ((letter != 't' && letter != 'o') || ti.args[k] >= m.tensors.size()) continue;
                if (!addressesBySlice(ti.op, k)) whole[ti.args[k]] = 1;
            }
        }
    }
    // Every run that stacks: the longest from each MATMUL of one x that is not already in one.
    struct Run {
        MatmulGroup g;
        uint32_t block, first;
    };
    std::vector<Run> runs;
    for (uint32_t b = 0; b < blocks.size(); ++b) {
        const std::vector<TensorInstr>& in = blocks[b];
        for (uint32_t i = 0; i < in.size();) {
            uint32_t end = i;
            MatmulGroup g;
            while (end < in.size() && in[end].op == Op::MATMUL && in[end].args[2] == in[i].args[2]) {
                const uint32_t w = in[end].args[1], d = in[end].args[0], x = in[i].args[2];
                const TensorDecl& wd = m.tensors[w];
                const bool ok = stackable(m.tensors[in[i].args[1]], wd) &&
                                viewable(m.tensors[in[i].args[0]], m.tensors[d], wd) && !whole[d] && d != x &&
                                std::find(g.weights.begin(), g.weights.end(), w) == g.weights.end() &&
                                std::find(g.dsts.begin(), g.dsts.end(), d) == g.dsts.end();
                if (!ok) break;
                g.weights.push_back(w);
                g.dsts.push_back(d);
                ++end;
            }
            if (g.weights.size() >= 2) runs.push_back({std::move(g), b, i});
            i = std::max(end, i + 1);
        }
    }
    // Rows: destinations written by several runs (every layer writes the same q, k and v) share
    // one row layout, the longest run's first; a run whose destinations are not consecutive in
    // order in the row it would share (a layer whose V matrix has another type stacks only Q and K:
    // a part of the row) is left unfused. A stack's matrices belong to it alone; the same stack
    // in another block (a model's forward, verify and score) runs as that group. A run left
    // unfused runs as before: its members stay valid tensors of their own.
    std::stable_sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.g.dsts.size() > b.g.dsts.size(); });
    std::vector<std::vector<uint32_t>> rows;
    rows.reserve(runs.size());
    std::map<uint32_t, size_t> row_of;    // destination -> its row
    std::map<uint32_t, size_t> stack_of;  // matrix -> its group
    std::vector<MatmulGroup> groups;
    for (Run& r : runs) {
        std::set<size_t> shared;
        for (uint32_t t : r.g.dsts) {
            if (auto it = row_of.find(t); it != row_of.end()) shared.insert(it->second);
        }
        size_t row = rows.size();
        if (shared.size() > 1) continue;
        if (shared.size() == 1) {
            row = *shared.begin();
            const std::vector<uint32_t>& have = rows[row];
            const auto at = std::find(have.begin(), have.end(), r.g.dsts[0]);
            if (at == have.end() || size_t(have.end() - at) < r.g.dsts.size() ||
                !std::equal(r.g.dsts.begin(), r.g.dsts.end(), at)) {
                continue;
            }
        }
        std::set<size_t> stacks;
        for (uint32_t t : r.g.weights) {
            if (auto it = stack_of.find(t); it != stack_of.end()) stacks.insert(it->second);
        }
        if (!stacks.empty()) {
            MatmulGroup& same = groups[*stacks.begin()];
            if (stacks.size() == 1 && same.weights == r.g.weights && same.dsts == r.g.dsts) {
                same.runs.emplace_back(r.block, r.first);
            }
            continue;
        }
        if (row == rows.size()) {
            rows.push_back(r.g.dsts);
            for (uint32_t t : r.g.dsts) row_of[t] = row;
        }
        for (uint32_t t : r.g.weights) stack_of[t] = groups.size();
        r.g.row = rows[row];
        r.g.runs.emplace_back(r.block, r.first);
        groups.push_back(std::move(r.g));
    }
    // In module order (blocks, then instructions), as the runs were found.
    std::sort(groups.begin(), groups.end(), [](const MatmulGroup& a, const MatmulGroup& b) { return a.runs[0] < b.runs[0]; });
    for (MatmulGroup& g : groups) std::sort(g.runs.begin(), g.runs.end());
    return groups;
}

}  // namespace blue
