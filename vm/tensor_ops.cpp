// Reference semantics of the tensor instructions (see tensor_ops.h). Each op has a check (shape
// and type rules, run by the verifier) and a reference implementation; both are short and plain.
#include "vm/tensor_ops.h"

#include <cstring>

#include "vm/abi.h"

namespace blue {

namespace {

const char* className(uint32_t cls) {
    switch (cls) {
        case BLUE_TC_WEIGHT: return "WEIGHT";
        case BLUE_TC_ROWS: return "ROWS";
        case BLUE_TC_INSTANCE: return "INSTANCE";
        case BLUE_TC_GLOBAL: return "GLOBAL";
    }
    return "?";
}

// ---- checks ------------------------------------------------------------------------------------

struct Checker {
    const Module& m;
    const TensorInstr& ti;

    const TensorDecl& t(size_t i) const { return m.tensors[ti.args[i]]; }

    Status fail(size_t i, const std::string& msg) const {
        return BLUE_ERROR("operand %zu (tensor '%s'): %s", i, t(i).name.c_str(), msg.c_str());
    }
    // The destination must be a per-row or per-instance activation.
    Status dst(size_t i) const {
        if (t(i).cls != BLUE_TC_ROWS && t(i).cls != BLUE_TC_INSTANCE) {
            return fail(i, strFormat("destination must be ROWS or INSTANCE, not %s",
                                     className(t(i).cls)));
        }
        return Status::ok();
    }
    Status dtype(size_t i, DType want) const {
        if (t(i).dtype != want) {
            return fail(i, strFormat("type %s, expected %s", std::string(dtypeName(t(i).dtype)).c_str(),
                                     std::string(dtypeName(want)).c_str()));
        }
        return Status::ok();
    }
    Status elements(size_t i, uint64_t want) const {
        if (t(i).elements() != want) {
            return fail(i, strFormat("has %llu elements per item, expected %llu",
                                     (unsigned long long)t(i).elements(), (unsigned long long)want));
        }
        return Status::ok();
    }
    Status notWeightDst(size_t i) const {
        if (t(i).cls == BLUE_TC_WEIGHT) return fail(i, "a WEIGHT tensor is read-only");
        return Status::ok();
    }
};

Status checkElementwise(const Checker& c, int inputs) {
    BLUE_TRY(c.dst(0));
    BLUE_TRY(c.dtype(0, DType::F32));
    for (int i = 1; i <= inputs; ++i) {
        BLUE_TRY(c.dtype(i, DType::F32));
        BLUE_TRY(c.elements(i, c.t(0).elements()));
    }
    return Status::ok();
}

Status checkMatmul(const Checker& c) {
    BLUE_TRY(c.dst(0));
    BLUE_TRY(c.dtype(0, DType::F32));
    const TensorDecl& w = c.t(1);
    if (w.cls != BLUE_TC_WEIGHT && w.cls != BLUE_TC_GLOBAL) {
        return c.fail(1, "matrix must be WEIGHT or GLOBAL");
    }
    if (w.ndim != 2) return c.fail(1, "matrix must be 2-D [K, N]");
    if (w.dtype != DType::F32) {
        return c.fail(1, strFormat("matrix type %s has no matmul kernel yet",
                                   std::string(dtypeName(w.dtype)).c_str()));
    }
    BLUE_TRY(c.dtype(2, DType::F32));
    BLUE_TRY(c.elements(2, w.ne[0]));
    BLUE_TRY(c.elements(0, w.ne[1]));
    return Status::ok();
}

// ---- reference execution -------------------------------------------------------------------

struct Items {
    const TensorOpEnv& env;
    bool rows_mode;  // iterate rows (dst is ROWS) or instances (dst is INSTANCE)

    uint32_t count() const {
        return uint32_t(rows_mode ? env.run->row_inst.size() : env.run->insts.size());
    }
    uint32_t instanceOf(uint32_t item) const {
        return rows_mode ? env.run->row_inst[item] : env.run->insts[item];
    }
    uint32_t rowOf(uint32_t item) const {
        return rows_mode ? item : env.run->inst_base[item] + env.run->inst_rows[item] - 1;
    }
    uint8_t* slice(uint32_t tensor, uint32_t item) const {
        const TensorDecl& t = env.module->tensors[tensor];
        uint8_t* base = env.tensors->data[tensor].data();
        uint64_t bytes = env.tensors->slice_bytes[tensor];
        switch (t.cls) {
            case BLUE_TC_ROWS: return base + uint64_t(rowOf(item)) * bytes;
            case BLUE_TC_INSTANCE: return base + uint64_t(instanceOf(item)) * bytes;
            default: return base;
        }
    }
    float* f32(uint32_t tensor, uint32_t item) const {
        return reinterpret_cast<float*>(slice(tensor, item));
    }
};

// dst = f(a, b) per element; `binary` says whether operand 2 is a tensor.
template <class F>
void elementwise(const Items& it, const TensorInstr& ti, bool binary, F f) {
    uint64_t n = it.env.module->tensors[ti.args[0]].elements();
    for (uint32_t item = 0; item < it.count(); ++item) {
        float* dst = it.f32(ti.args[0], item);
        const float* a = it.f32(ti.args[1], item);
        const float* b = binary ? it.f32(ti.args[2], item) : nullptr;
        for (uint64_t i = 0; i < n; ++i) dst[i] = f(a[i], b ? b[i] : 0.0f);
    }
}

void refMatmul(const Items& it, const TensorInstr& ti) {
    const TensorDecl& w = it.env.module->tensors[ti.args[1]];
    uint64_t k_len = w.ne[0], n_len = w.ne[1];
    const float* wd = it.f32(ti.args[1], 0);
    for (uint32_t item = 0; item < it.count(); ++item) {
        float* dst = it.f32(ti.args[0], item);
        const float* x = it.f32(ti.args[2], item);
        for (uint64_t n = 0; n < n_len; ++n) {
            double acc = 0;
            for (uint64_t k = 0; k < k_len; ++k) acc += double(wd[n * k_len + k]) * x[k];
            dst[n] = float(acc);
        }
    }
}

void refSum(const Items& it, const TensorInstr& ti) {
    uint64_t n = it.env.module->tensors[ti.args[1]].elements();
    for (uint32_t item = 0; item < it.count(); ++item) {
        const float* a = it.f32(ti.args[1], item);
        double acc = 0;
        for (uint64_t i = 0; i < n; ++i) acc += a[i];
        it.f32(ti.args[0], item)[0] = float(acc);
    }
}

float bitsToFloat(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace

uint64_t tensorSliceBytes(const TensorDecl& t) {
    return *dtypeRowBytes(t.dtype, t.ne[0]) * (t.elements() / t.ne[0]);
}

void allocRefTensors(const Module& m, uint32_t instances, RefTensors* out) {
    out->data.resize(m.tensors.size());
    out->slice_bytes.resize(m.tensors.size());
    for (size_t i = 0; i < m.tensors.size(); ++i) {
        const TensorDecl& t = m.tensors[i];
        uint64_t slice = tensorSliceBytes(t);
        uint64_t count = t.cls == BLUE_TC_ROWS       ? m.layout.max_rows
                         : t.cls == BLUE_TC_INSTANCE ? instances
                                                     : 1;
        out->slice_bytes[i] = slice;
        out->data[i].assign(slice * count, 0);
    }
}

Status checkTensorOp(const Module& m, const TensorInstr& ti) {
    Checker c{m, ti};
    switch (ti.op) {
        case Op::TADD:
        case Op::TMUL: return checkElementwise(c, 2);
        case Op::TSCALE: return checkElementwise(c, 1);
        case Op::MATMUL: return checkMatmul(c);
        case Op::TSUM:
            BLUE_TRY(c.dst(0));
            BLUE_TRY(c.dtype(0, DType::F32));
            BLUE_TRY(c.dtype(1, DType::F32));
            return Status::ok();
        default: break;
    }
    return BLUE_ERROR("no rules for tensor op 0x%02x", uint32_t(ti.op));
}

void runTensorOpRef(const TensorOpEnv& env, const TensorInstr& ti) {
    const TensorDecl& dst = env.module->tensors[ti.args[0]];
    Items it{env, dst.cls == BLUE_TC_ROWS};
    switch (ti.op) {
        case Op::TADD: elementwise(it, ti, true, [](float a, float b) { return a + b; }); return;
        case Op::TMUL: elementwise(it, ti, true, [](float a, float b) { return a * b; }); return;
        case Op::TSCALE: {
            float s = bitsToFloat(ti.args[2]);
            elementwise(it, ti, false, [s](float a, float) { return a * s; });
            return;
        }
        case Op::MATMUL: refMatmul(it, ti); return;
        case Op::TSUM: refSum(it, ti); return;
        default: assert(false && "tensor op without a reference implementation");
    }
}

}  // namespace blue
