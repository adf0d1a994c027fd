// Lowering of custom kernels (see lower_kernel.h). A `score` statement's control code (emitted in
// lower.cpp) copies the slot into the kernel's slot tensor and runs a one-instruction block:
// KERNEL results, slot, kernel index, param.
#include "compiler/cascade/lower_kernel.h"

#include <filesystem>

#include "compiler/cascade/kernel_source.h"
#include "vm/abi.h"
#include "vm/isa.h"
#include "vm/kernel.h"
#include "vm/kernel_abi.h"
#include "vm/weights.h"

namespace blue::cascade {

namespace {

Status errorAt(const Program& p, Loc l, const std::string& msg) {
    return BLUE_ERROR("%s:%u:%u: %s", p.file.c_str(), l.line, l.col, msg.c_str());
}

bool before(Loc a, Loc b) {
    return a.line < b.line || (a.line == b.line && a.col < b.col);
}

void forEachScore(const std::vector<Stmt>& body, const std::function<void(const Stmt&)>& f) {
    for (const Stmt& s : body) {
        if (s.kind == Stmt::SCORE) f(s);
        forEachScore(s.body, f);
        forEachScore(s.else_body, f);
    }
}

}  // namespace

int kernelIndex(const Program& p, const std::string& name) {
    for (size_t i = 0; i < p.kernels.size(); ++i) {
        if (p.kernels[i].name == name) return int(i);
    }
    return -1;
}

uint32_t kernelMetricWord(const std::string& metric) {
    return metric == "value" ? 0 : uint32_t(std::stoul(metric.substr(5)));
}

Status checkKernelCond(const Program& p, uint32_t k, const Cond& c, Loc at) {
    bool valid = c.metric == "value";
    if (!valid && c.metric.size() > 5 && c.metric.compare(0, 5, "value") == 0 &&
        c.metric.size() <= 7) {
        std::string digits = c.metric.substr(5);
        valid = digits.find_first_not_of("0123456789") == std::string::npos && digits[0] != '0' &&
                std::stoul(digits) < BLUE_KERNEL_RESULT_WORDS;
    }
    if (!valid) {
        return errorAt(
            p, c.metric_loc,
            strFormat("a kernel's results are 'value' (word 0) and 'value1'..'value%u'; found '%s'",
                      BLUE_KERNEL_RESULT_WORDS - 1, c.metric.c_str()));
    }
    bool scored = false;
    forEachScore(p.body, [&](const Stmt& s) { scored |= s.kernel == k && before(s.loc, at); });
    if (!scored) {
        return errorAt(
            p, c.loc,
            "kernel '" + c.subject + "' is not run by a `score` statement before this condition");
    }
    return Status::ok();
}

Status checkKernelUses(const Program& p, const SlotLookup& slot_index) {
    Status st = Status::ok();
    forEachScore(p.body, [&](const Stmt& s) {
        if (st && slot_index(s.score_slot) < 0)
            st = errorAt(p, s.score_slot_loc, "no slot named '" + s.score_slot + "'");
        if (st && !s.score_into.empty()) {
            int into = slot_index(s.score_into);
            if (into < 0) st = errorAt(p, s.score_into_loc, "no slot named '" + s.score_into + "'");
            if (into == 0) st = errorAt(p, s.score_into_loc, "the input slot is read-only");
        }
    });
    return st;
}

Status lowerKernels(const Program& p, const SlotLookup& slot_index, const Tokenize& tokens,
                    const std::vector<uint32_t>& slot_cap, Module& m, LoweredKernels* out) {
    std::string src_dir = std::filesystem::path(p.file).parent_path().string();
    out->kernels.resize(p.kernels.size());
    for (size_t k = 0; k < p.kernels.size(); ++k) {
        const KernelUse& ku = p.kernels[k];
        auto words = loadKernelFile(resolveModulePath(src_dir, ku.path));
        if (!words) return errorAt(p, ku.path_loc, "kernel '" + ku.name + "': " + words.message());
        auto shape = reflectKernelSpirv(words.value(), ku.path);
        if (!shape) return errorAt(p, ku.path_loc, "kernel '" + ku.name + "': " + shape.message());
        const bool declares_out = shape->bindings >> BLUE_KERNEL_BIND_OUT & 1;
        m.kernels.push_back({ku.name, std::move(words.value())});
        uint32_t cap = 1, out_cap = 0;
        Status use = Status::ok();
        forEachScore(p.body, [&](const Stmt& s) {
            if (s.kernel != k) return;
            cap = std::max(cap, slot_cap[size_t(slot_index(s.score_slot))]);
            if (!s.score_into.empty())
                out_cap = std::max(out_cap, slot_cap[size_t(slot_index(s.score_into))]);
            if (use && s.score_into.empty() && declares_out) {
                use = errorAt(p, s.loc,
                              "kernel '" + ku.name +
                                  "' writes a slot (binding 3): run it with `filter SLOT with " +
                                  ku.name + " into TARGET`");
            }
            if (use && !s.score_into.empty() && !declares_out) {
                use = errorAt(
                    p, s.score_into_loc,
                    "kernel '" + ku.name + "' declares no binding 3, the slot a `filter` writes");
            }
        });
        BLUE_TRY(use);
        LoweredKernel& lk = out->kernels[k];
        lk.slot_words = 1 + cap;
        TensorDecl slot;
        slot.name = "kernel/" + ku.name + "/slot";
        slot.dtype = DType::I32;
        slot.cls = BLUE_TC_INSTANCE;
        slot.ne = {lk.slot_words, 1, 1, 1};
        m.tensors.push_back(slot);
        lk.slot_tensor = uint32_t(m.tensors.size() - 1);
        TensorDecl result;
        result.name = "kernel/" + ku.name + "/result";
        result.cls = BLUE_TC_INSTANCE;
        result.ne = {BLUE_KERNEL_RESULT_WORDS, 1, 1, 1};
        m.tensors.push_back(result);
        lk.result_tensor = uint32_t(m.tensors.size() - 1);
        if (out_cap) {
            TensorDecl out_slot;
            out_slot.name = "kernel/" + ku.name + "/out";
            out_slot.dtype = DType::I32;
            out_slot.cls = BLUE_TC_INSTANCE;
            out_slot.ne = {1 + out_cap, 1, 1, 1};
            m.tensors.push_back(out_slot);
            lk.out_tensor = uint32_t(m.tensors.size() - 1);
        }
    }
    Status st = Status::ok();
    forEachScore(p.body, [&](const Stmt& s) {
        if (!st || s.score_param_text.empty()) return;
        std::vector<uint32_t> ids = tokens(s.score_param_text);
        if (ids.size() != 1) {
            st = errorAt(
                p, s.score_param_loc,
                strFormat("param \"%s\" is %zu tokens; a text param must be exactly one token",
                          s.score_param_text.c_str(), ids.size()));
        }
    });
    BLUE_TRY(st);
    uint32_t n = 0;
    forEachScore(p.body, [&](const Stmt& s) {
        const LoweredKernel& lk = out->kernels[s.kernel];
        BlockDecl b;
        b.name = strFormat("score/%s/%u", p.kernels[s.kernel].name.c_str(), n++);
        b.tcode_offset = uint32_t(m.tcode.size());
        b.nargs = 1;  // arg[0]: one row per instance
        m.tcode.push_back(encodeTensorHeader(uint8_t(Op::KERNEL), 5));
        uint32_t param = s.score_param_text.empty() ? s.score_param : tokens(s.score_param_text)[0];
        uint32_t written = s.score_into.empty() ? 0xFFFFFFFFu : lk.out_tensor;
        for (uint32_t w : {lk.result_tensor, lk.slot_tensor, s.kernel, param, written})
            m.tcode.push_back(w);
        b.tcode_words = uint32_t(m.tcode.size()) - b.tcode_offset;
        m.blocks.push_back(b);
        out->blocks[&s] = uint32_t(m.blocks.size() - 1);
    });
    return Status::ok();
}

}  // namespace blue::cascade
