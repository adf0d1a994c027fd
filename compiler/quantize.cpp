// quantizeGguf: plans each tensor's output type, then streams the converted tensors through a
// GgufWriter, decoding and encoding rows on several threads (see quantize.h).
#include "compiler/quantize.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "vm/quant.h"

namespace blue {

namespace {

constexpr uint64_t kMinElemsPerThread = 16384;  // smaller jobs are not worth a thread
constexpr size_t kNamesPerNote = 3;

bool isInteger(DType t) {
    return t == DType::I8 || t == DType::I16 || t == DType::I32;
}

bool isBlockType(DType t) {
    return dtypeInfo(t)->block_elems > 1;
}

std::string nameList(const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size() && i < kNamesPerNote; ++i) s += (i ? ", " : "") + names[i];
    if (names.size() > kNamesPerNote) s += strFormat(" and %zu more", names.size() - kNamesPerNote);
    return s;
}

// One note per group of tensors that had to leave the mix's type for their row length, and one
// per input type that gets requantized.
std::vector<std::string> planNotes(const std::vector<QuantizeTensorPlan>& plan) {
    std::map<std::tuple<DType, DType, int64_t>, std::vector<std::string>> fallbacks;
    std::map<std::pair<DType, DType>, std::vector<std::string>> requantized;
    for (const QuantizeTensorPlan& p : plan) {
        if (!p.matrix) continue;
        if (p.to != p.wanted) fallbacks[{p.wanted, p.to, p.row_len}].push_back(p.name);
        if (isBlockType(p.from) && p.from != p.to) requantized[{p.from, p.to}].push_back(p.name);
    }
    std::vector<std::string> notes;
    for (const auto& [key, names] : fallbacks) {
        auto [wanted, to, row_len] = key;
        notes.push_back(strFormat("%zu tensor(s) with rows of %" PRId64
                                  " elements (not whole %u-element %s blocks) "
                                  "stored as %s: %s",
                                  names.size(), row_len, dtypeInfo(wanted)->block_elems,
                                  dtypeName(wanted).data(), dtypeName(to).data(),
                                  nameList(names).c_str()));
    }
    for (const auto& [key, names] : requantized) {
        notes.push_back(strFormat(
            "%zu tensor(s) are already %s: requantizing them to %s adds the errors of both "
            "formats: %s",
            names.size(), dtypeName(key.first).data(), dtypeName(key.second).data(),
            nameList(names).c_str()));
    }
    return notes;
}

// Converts rows [first, first + n) of a tensor from its input bytes into `out`. Fails on a row
// holding NaN or infinity (quantizing it would give unspecified blocks).
Status convertRows(const QuantizeTensorPlan& p, std::span<const uint8_t> src, uint64_t first,
                   uint64_t n, std::span<uint8_t> out, uint32_t threads) {
    const uint64_t in_row = *dtypeRowBytes(p.from, uint64_t(p.row_len));
    const uint64_t out_row = *dtypeRowBytes(p.to, uint64_t(p.row_len));
    assert(out.size() == n * out_row && (first + n) * in_row <= src.size());
    if (p.from == p.to) {
        std::memcpy(out.data(), src.data() + first * in_row, n * in_row);
        return {};
    }
    std::atomic<uint64_t> bad_row{UINT64_MAX};
    auto work = [&](uint64_t r0, uint64_t count) {
        std::vector<float> row(size_t(p.row_len));
        for (uint64_t r = r0; r < r0 + count; ++r) {
            dequantizeRow(p.from, src.data() + (first + r) * in_row, row.data(), p.row_len);
            bool finite =
                std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); });
            if (!finite) {
                uint64_t seen = bad_row.load();
                while (first + r < seen && !bad_row.compare_exchange_weak(seen, first + r)) {
                }
                continue;
            }
            quantizeRow(p.to, row.data(), out.data() + r * out_row, p.row_len);
        }
    };
    uint64_t min_rows = std::max<uint64_t>(1, kMinElemsPerThread / uint64_t(p.row_len));
    quantizeParallelRows(n, threads, work, min_rows);
    if (bad_row.load() != UINT64_MAX) {
        return BLUE_ERROR("row %" PRIu64 " holds a non-finite value (NaN or infinity)",
                          bad_row.load());
    }
    return {};
}

bool sameFile(const std::string& a, const std::string& b) {
    std::error_code ec;
    return std::filesystem::equivalent(a, b, ec) && !ec;
}

}  // namespace

std::string QuantizeReport::typeSummary() const {
    std::map<DType, size_t> counts;
    for (const QuantizeTensorPlan& p : tensors) ++counts[p.to];
    std::vector<std::pair<DType, size_t>> order(counts.begin(), counts.end());
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    std::string s;
    for (const auto& [type, count] : order) {
        s += strFormat("%s%zu %s", s.empty() ? "" : ", ", count, dtypeName(type).data());
    }
    return s;
}

void quantizeParallelRows(uint64_t n_rows, uint32_t threads,
                          const std::function<void(uint64_t first, uint64_t count)>& fn,
                          uint64_t min_rows_per_thread) {
    if (n_rows == 0) return;
    uint64_t n_threads = std::max<uint64_t>(threads, 1);
    n_threads = std::min(
        n_threads, std::max<uint64_t>(1, n_rows / std::max<uint64_t>(1, min_rows_per_thread)));
    if (n_threads == 1) {
        fn(0, n_rows);
        return;
    }
    std::vector<std::thread> pool;
    pool.reserve(size_t(n_threads - 1));
    const uint64_t per = n_rows / n_threads, extra = n_rows % n_threads;
    uint64_t first = 0;
    for (uint64_t i = 0; i < n_threads; ++i) {
        uint64_t count = per + (i < extra ? 1 : 0);
        if (i + 1 == n_threads) {
            fn(first, count);
        } else {
            pool.emplace_back([&fn, first, count] { fn(first, count); });
        }
        first += count;
    }
    for (std::thread& t : pool) t.join();
}

Result<std::vector<QuantizeTensorPlan>> quantizePlan(const GgufFile& file, QuantizeTarget target,
                                                     bool pure) {
    assert(quantizeIsTarget(target.type));
    Result<ModelConfig> config = modelConfigFromGguf(file);
    if (!config) return BLUE_ERROR("not a model BlueVM can load: %s", config.message().c_str());
    const QuantizeModelInfo model = quantizeModelInfo(*config);
    std::vector<QuantizeTensorPlan> plan;
    for (const GgufTensor& t : file.tensors()) {
        QuantizeTensorPlan p;
        p.name = std::string(t.name);
        p.from = t.type;
        p.row_len = t.ne[0];
        p.matrix = quantizeIsWeightMatrix(t.name, t.n_dims);
        if (p.matrix) {
            p.wanted = quantizeMixType(t.name, p.row_len, target, model, pure);
            p.to = quantFallback(p.wanted, p.row_len);
        } else {
            p.wanted = p.to = isInteger(t.type) ? t.type : DType::F32;
        }
        p.bytes_in = t.n_bytes;
        p.bytes_out = *dtypeRowBytes(p.to, uint64_t(p.row_len)) * uint64_t(t.rows());
        plan.push_back(std::move(p));
    }
    return plan;
}

Result<QuantizeReport> quantizeGguf(const std::string& in, const std::string& out, QuantizeTarget target,
                                    const QuantizeOptions& options) {
    if (!quantizeIsTarget(target.type)) {
        return BLUE_ERROR("%s is not a quantization type (choose one of: %s)",
                          dtypeName(target.type).data(), quantizeTypeNames().c_str());
    }
    if (sameFile(in, out))
        return BLUE_ERROR("%s: the output must not be the input file", out.c_str());
    Result<GgufFile> file = ggufOpen(in);
    if (!file) return file.status();
    Result<std::vector<QuantizeTensorPlan>> plan = quantizePlan(*file, target, options.pure);
    if (!plan) return plan.status();

    QuantizeReport report;
    report.tensors = std::move(plan.value());
    report.notes = planNotes(report.tensors);
    report.file_bytes_in = file->bytes().size();
    report.file_type = target.file_type;
    if (options.on_note) {
        for (const std::string& note : report.notes) options.on_note(note);
    }

    GgufWriter writer;
    for (const GgufKv& kv : file->kvs()) writer.setValue(kv.key, kv.value);
    writer.setU32("general.quantization_version", 2);
    writer.setU32("general.file_type", report.file_type);

    const uint32_t threads =
        options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
    uint64_t total = 0, done = 0;
    Status bad_input;  // a conversion failure, reported instead of the writer's wrapped message
    for (const QuantizeTensorPlan& p : report.tensors) total += p.bytes_in;
    for (size_t i = 0; i < report.tensors.size(); ++i) {
        const GgufTensor& t = file->tensors()[i];
        const QuantizeTensorPlan& p = report.tensors[i];
        std::span<const uint8_t> src = file->rawTensorData(t);
        const uint64_t in_row = p.bytes_in / uint64_t(t.rows());
        auto fill = [&, plan_entry = &p, src, in_row](uint64_t first, uint64_t n,
                                                      std::span<uint8_t> dst) -> Status {
            Status s = convertRows(*plan_entry, src, first, n, dst, threads);
            if (!s) {
                bad_input = s.prefix(in + ": tensor '" + plan_entry->name + "'");
                return s;
            }
            done += n * in_row;
            if (options.progress) options.progress(done, total);
            return {};
        };
        std::vector<int64_t> dims(t.ne.begin(), t.ne.begin() + t.n_dims);
        BLUE_TRY(writer.addTensor(t.name, p.to, dims, fill));
    }
    if (Status s = writer.write(out); !s) return bad_input.isOk() ? s : bad_input;
    std::error_code ec;
    report.file_bytes_out = std::filesystem::file_size(out, ec);
    return report;
}

}  // namespace blue
