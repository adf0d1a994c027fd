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
    std::vector<MatmulGroup> groups;
    groups.reserve(m.tensors.size());  // row_of points into it
    std::map<uint32_t, size_t> stack_of;  // matrix -> its group
    std::map<uint32_t, const std::vector<uint32_t>*> row_of;  // destination -> the row it is a view of
    for (uint32_t b = 0; b < blocks.size(); ++b) {
        const std::vector<TensorInstr>& in = blocks[b];
        for (uint32_t i = 0; i < in.size();) {
            // The longest run from i that stacks: plain MATMULs over one x.
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
            if (g.weights.size() < 2) {
                i = std::max(end, i + 1);
                continue;
            }
            // A stack's matrices belong to it alone; the same stack in another block runs as
            // that group (a model's forward, verify and score). Destinations may be shared by
            // several stacks (every layer writes the same q, k and v), laid out the same way.
            // A run that clashes is left unfused: its members stay valid tensors of their own.
            std::set<size_t> stacks;
            for (uint32_t t : g.weights) {
                if (auto it = stack_of.find(t); it != stack_of.end()) stacks.insert(it->second);
            }
            bool rows_agree = true;
            for (uint32_t t : g.dsts) {
                if (auto it = row_of.find(t); it != row_of.end()) rows_agree &= *it->second == g.dsts;
            }
            if (stacks.empty() && rows_agree) {
                for (uint32_t t : g.weights) stack_of[t] = groups.size();
                g.runs.emplace_back(b, i);
                groups.push_back(std::move(g));
                for (uint32_t t : groups.back().dsts) row_of.emplace(t, &groups.back().dsts);
            } else if (stacks.size() == 1 && groups[*stacks.begin()].weights == g.weights &&
                       groups[*stacks.begin()].dsts == g.dsts) {
                groups[*stacks.begin()].runs.emplace_back(b, i);
            }
            i = end;
        }
    }
    return groups;
}

}  // namespace blue
