// Reference semantics of the tensor instructions (see tensor_ops.h). Each op has a check (shape
// and type rules, run by the verifier) and a reference implementation; both are short and plain.
#include "vm/tensor_ops.h"

#include <cmath>
#include <cstring>

#include "vm/abi.h"
#include "vm/kernel.h"
#include "vm/kernel_abi.h"
#include "vm/quant.h"
#include "vm/tensor_ops_internal.h"

namespace blue {

const char* tensorClassName(uint32_t cls) {
    switch (cls) {
        case BLUE_TC_WEIGHT: return "WEIGHT";
        case BLUE_TC_ROWS: return "ROWS";
        case BLUE_TC_INSTANCE: return "INSTANCE";
        case BLUE_TC_GLOBAL: return "GLOBAL";
    }
    return "?";
}

namespace {

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
    if (!quantCanDecode(w.dtype) || w.dtype == DType::Q8_K) {
        return c.fail(1, strFormat("matrix type %s cannot be multiplied",
                                   std::string(dtypeName(w.dtype)).c_str()));
    }
    BLUE_TRY(c.dtype(2, DType::F32));
    BLUE_TRY(c.elements(2, w.ne[0]));
    BLUE_TRY(c.elements(0, w.ne[1]));
    return Status::ok();
}

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

// MATMUL, MATMULADD and MATMULGLU: the product rounded to float, then (MATMULADD) added to dst in
// float, as a MATMUL into a temporary and a TADD would, or (MATMULGLU) gating dst as SWIGLU or
// GEGLU would.
void refMatmul(const Items& it, const TensorInstr& ti) {
    const TensorDecl& w = it.env.module->tensors[ti.args[1]];
    uint64_t k_len = w.ne[0], n_len = w.ne[1];
    uint64_t row_bytes = *dtypeRowBytes(w.dtype, k_len);
    const uint8_t* wd = it.slice(ti.args[1], 0);
    for (uint32_t item = 0; item < it.count(); ++item) {
        float* dst = it.f32(ti.args[0], item);
        const float* x = it.f32(ti.args[2], item);
        for (uint64_t n = 0; n < n_len; ++n) {
            const float v = dotRow(w.dtype, wd + n * row_bytes, x, int64_t(k_len));
            switch (ti.op) {
                case Op::MATMULADD: dst[n] = dst[n] + v; break;
                case Op::MATMULGLU: dst[n] = ti.args[3] == BLUE_GLU_GELU ? geluTimes(v, dst[n]) : siluTimes(v, dst[n]); break;
                default: dst[n] = v; break;
            }
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

// KERNEL: dst INSTANCE F32 of at most BLUE_KERNEL_RESULT_WORDS elements, src INSTANCE I32 of a
// length word and at least one token, a kernel index within the module's KERNELS.
Status checkKernelOp(const Checker& c) {
    if (c.t(0).cls != BLUE_TC_INSTANCE) return c.fail(0, "a custom kernel's results must be an INSTANCE tensor");
    BLUE_TRY(c.dtype(0, DType::F32));
    if (c.t(0).elements() > BLUE_KERNEL_RESULT_WORDS) {
        return c.fail(0, strFormat("%llu result words per instance, at most %u",
                                   (unsigned long long)c.t(0).elements(), BLUE_KERNEL_RESULT_WORDS));
    }
    if (c.t(1).cls != BLUE_TC_INSTANCE) return c.fail(1, "a custom kernel's slot must be an INSTANCE tensor");
    BLUE_TRY(c.dtype(1, DType::I32));
    if (c.t(1).elements() < 2 || c.t(1).elements() > (1u << 20)) {
        return c.fail(1, "a slot of a length word and 1 to 2^20 - 1 tokens is needed");
    }
    if (c.ti.args[2] >= c.m.kernels.size()) {
        return BLUE_ERROR("kernel %u does not exist (%zu kernels)", c.ti.args[2], c.m.kernels.size());
    }
    const bool writes = c.ti.args[4] != 0xFFFFFFFFu;
    if (writes) {
        if (c.t(4).cls != BLUE_TC_INSTANCE) return c.fail(4, "a custom kernel's written slot must be an INSTANCE tensor");
        BLUE_TRY(c.dtype(4, DType::I32));
        if (c.t(4).elements() < 2 || c.t(4).elements() > (1u << 20)) {
            return c.fail(4, "a slot of a length word and 1 to 2^20 - 1 tokens is needed");
        }
    }
    // A kernel that declares the written slot (binding 3) needs one bound: the instruction names it.
    const KernelDecl& k = c.m.kernels[c.ti.args[2]];
    auto shape = reflectKernelSpirv(k.spirv, "kernel '" + k.name + "'");
    if (!shape) return shape.status();
    if ((shape->bindings >> BLUE_KERNEL_BIND_OUT & 1) && !writes) {
        return BLUE_ERROR("kernel '%s' declares binding 3 (a slot it writes), but the instruction names no slot",
                          k.name.c_str());
    }
    return Status::ok();
}

}  // namespace

float bitsToFloat(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

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
        case Op::SOFTCAP: {
            float cap = bitsToFloat(ti.args[2]);
            if (!(cap > 0.0f) || !std::isfinite(cap)) return BLUE_ERROR("soft cap %g must be positive", cap);
            return checkElementwise(c, 1);
        }
        case Op::MATMUL: return checkMatmul(c);
        case Op::MATMULADD:
            if (c.ti.args[0] == c.ti.args[2]) return c.fail(2, "x must not be the destination it is added into");
            return checkMatmul(c);
        case Op::MATMULGLU:
            if (c.ti.args[0] == c.ti.args[2]) return c.fail(2, "x must not be the destination it gates");
            if (c.ti.args[3] != BLUE_GLU_SILU && c.ti.args[3] != BLUE_GLU_GELU) {
                return BLUE_ERROR("activation %u: 0 (silu) or 1 (gelu)", c.ti.args[3]);
            }
            return checkMatmul(c);
        case Op::TSUM:
            BLUE_TRY(c.dst(0));
            BLUE_TRY(c.dtype(0, DType::F32));
            BLUE_TRY(c.dtype(1, DType::F32));
            return Status::ok();
        case Op::KERNEL: return checkKernelOp(c);
        case Op::MOEROUTE:
        case Op::MOEMM:
        case Op::MOEMIX: return checkMoeOp(c);
        case Op::KVSTOREP:
        case Op::ATTNP:
        case Op::PGCOPY:
        case Op::KVCOPYP: return checkKvPagesOp(c);
        default: return checkLlmOp(c);
    }
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
        case Op::SOFTCAP: {
            double cap = bitsToFloat(ti.args[2]);
            elementwise(it, ti, false, [cap](float a, float) { return float(cap * std::tanh(a / cap)); });
            return;
        }
        case Op::MATMUL:
        case Op::MATMULADD:
        case Op::MATMULGLU: refMatmul(it, ti); return;
        case Op::TSUM: refSum(it, ti); return;
        case Op::KERNEL: assert(false && "refCanRun() refuses modules with custom kernels"); return;
        default:
            if (!runLlmOpRef(it, ti) && !runMoeOpRef(it, ti) && !runKvPagesOpRef(it, ti)) assert(false && "tensor op without a reference implementation");
    }
}

}  // namespace blue
