// Pipeline layout, lazy pipeline creation and the on-disk pipeline cache (see pipelines.h).
#include "host/pipelines.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "host/vk_check.h"
#include "shaders/blue_config.h"
#include "shaders/embedded.h"

namespace blue {

namespace {

const EmbeddedShader* findShader(const std::string& name) {
    for (size_t i = 0; i < kEmbeddedShaderCount; ++i) {
        if (name == kEmbeddedShaders[i].name) return &kEmbeddedShaders[i];
    }
    return nullptr;
}

struct DeviceVariant {
    const char* kernel;
    const char* variant;
    bool (*wanted)(const DeviceInfo&);
    const char* because;    // why the variant is chosen
    const char* otherwise;  // why the kernel itself is
};

const DeviceVariant kVariants[] = {
    {"sequencer", "sequencer_noballot", [](const DeviceInfo& d) { return !d.subgroup_ballot; },
     "no subgroup ballot in compute: live instances are counted with one atomic add each",
     "subgroup ballot in compute: one atomic add per subgroup counts its live instances"},
};

void makeDirs(const std::string& path) {
    for (size_t i = 1; i <= path.size(); ++i) {
        if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
    }
}

}  // namespace

std::string kernelVariant(const std::string& kernel, const DeviceInfo& info) {
    for (const DeviceVariant& v : kVariants) {
        if (kernel == v.kernel && v.wanted(info)) return v.variant;
    }
    return kernel;
}

std::string kernelVariantReason(const std::string& kernel, const DeviceInfo& info) {
    for (const DeviceVariant& v : kVariants) {
        if (kernel == v.kernel) return v.wanted(info) ? v.because : v.otherwise;
    }
    return "";
}

bool kernelChosen(const std::string& embedded, const DeviceInfo& info) {
    // The int8 GEMMs (matmul_*_tq) declare the integer dot product capabilities: a device
    // without them never runs one (KernelChoice::int8_matmul), nor the CPU drivers' int8 kernels
    // (`_b1q`, `_q`, `_iq`), which the same choice gates, nor PACKX, which packs their x.
    if (embedded.ends_with("_tq") || embedded.ends_with("_iq") || embedded.ends_with("_b1q") ||
        embedded.ends_with("_q") || embedded == "packx") {
        return info.int_dot;
    }
    for (const DeviceVariant& v : kVariants) {
        if (embedded == v.variant) return v.wanted(info);
        if (embedded == v.kernel) return !v.wanted(info);
    }
    return true;
}

namespace {

constexpr char kCacheMagic[8] = {'B', 'L', 'U', 'E', 'P', 'C', '0', '1'};
constexpr size_t kCacheHeader = sizeof kCacheMagic + 8;

uint64_t fnv1a64(const char* data, size_t size) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < size; ++i) h = (h ^ uint8_t(data[i])) * 1099511628211ull;
    return h;
}

}  // namespace

std::vector<char> encodePipelineCache(const std::vector<char>& blob) {
    std::vector<char> file(kCacheHeader + blob.size());
    std::memcpy(file.data(), kCacheMagic, sizeof kCacheMagic);
    const uint64_t h = fnv1a64(blob.data(), blob.size());
    for (int i = 0; i < 8; ++i) file[sizeof kCacheMagic + i] = char(h >> (8 * i));
    std::copy(blob.begin(), blob.end(), file.begin() + kCacheHeader);
    return file;
}

std::optional<std::vector<char>> decodePipelineCache(const std::vector<char>& file) {
    if (file.size() < kCacheHeader || std::memcmp(file.data(), kCacheMagic, sizeof kCacheMagic) != 0) {
        return std::nullopt;
    }
    uint64_t h = 0;
    for (int i = 0; i < 8; ++i) h |= uint64_t(uint8_t(file[sizeof kCacheMagic + i])) << (8 * i);
    if (fnv1a64(file.data() + kCacheHeader, file.size() - kCacheHeader) != h) return std::nullopt;
    return std::vector<char>(file.begin() + kCacheHeader, file.end());
}

bool writePipelineCacheFile(const std::string& path, const std::vector<char>& blob) {
    // A name no other process or thread uses: the rename then replaces the cache whole.
    static std::atomic<uint32_t> serial{0};
    const std::string tmp = strFormat("%s.%ld.%u.tmp", path.c_str(), long(getpid()), serial++);
    const std::vector<char> file = encodePipelineCache(blob);
    bool ok = false;
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        ok = out && out.write(file.data(), std::streamsize(file.size())) && out.flush();
    }
    ok = ok && std::rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) std::remove(tmp.c_str());
    return ok;
}

std::vector<char> readPipelineCacheFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return {};
    std::vector<char> file{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::optional<std::vector<char>> blob = decodePipelineCache(file);
    return blob ? std::move(*blob) : std::vector<char>{};
}

namespace {

// The count after a suffix's mark (1 to 4 digits, not 0); nothing when it is not one.
std::optional<uint32_t> suffixCount(const std::string& digits) {
    if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos) {
        return std::nullopt;
    }
    const uint32_t n = uint32_t(std::stoul(digits));
    if (n == 0) return std::nullopt;
    return n;
}

}  // namespace

std::optional<KernelWidth> splitKernelWidth(const std::string& name) {
    KernelWidth k;
    std::string rest = name;
    if (const size_t hash = rest.find('#'); hash != std::string::npos) {
        const std::optional<uint32_t> q = suffixCount(rest.substr(hash + 1));
        if (!q) return std::nullopt;
        k.head_quads = *q;
        rest.resize(hash);
    }
    const size_t at = rest.find('@');
    k.kernel = rest.substr(0, at);
    if (at == std::string::npos) return k;
    const std::optional<uint32_t> w = suffixCount(rest.substr(at + 1));
    if (!w) return std::nullopt;
    k.width = *w;
    return k;
}

bool Pipelines::exists(const std::string& name) {
    const std::optional<KernelWidth> k = splitKernelWidth(name);
    return k && findShader(k->kernel) != nullptr;
}

std::string Pipelines::cachePath() const {
    if (const char* off = std::getenv("BLUE_NO_PIPELINE_CACHE");
        off && *off && std::strcmp(off, "0")) {
        return "";
    }
    std::string dir;
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
        dir = x;
    } else if (const char* home = std::getenv("HOME"); home && *home) {
        dir = std::string(home) + "/.cache";
    } else {
        return "";
    }
    const uint8_t* uuid = dev_.props().pipelineCacheUUID;
    std::string id;
    for (uint32_t i = 0; i < VK_UUID_SIZE; ++i) id += strFormat("%02x", uuid[i]);
    return dir + "/bluevm/pipelines-" + id + ".bin";
}

Result<std::unique_ptr<Pipelines>> Pipelines::create(Device& dev) {
    std::unique_ptr<Pipelines> p(new Pipelines(dev));
    VkDescriptorSetLayoutBinding bindings[3] = {};
    const uint32_t numbers[3] = {BLUE_BIND_CONTROL, BLUE_BIND_PAGES, BLUE_BIND_IO};
    for (int i = 0; i < 3; ++i) {
        bindings[i].binding = numbers[i];
        bindings[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        bindings[i].descriptorCount = numbers[i] == BLUE_BIND_PAGES ? BLUE_MAX_PAGES : 1;
        bindings[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo si{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    si.bindingCount = 3;
    si.pBindings = bindings;
    BLUE_VK_TRY(vkCreateDescriptorSetLayout(dev.device(), &si, nullptr, &p->set_layout_));
    VkDescriptorSetLayoutBinding operands{0, VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER,
                                          BLUE_MAX_TEX_OPERANDS, VK_SHADER_STAGE_COMPUTE_BIT,
                                          nullptr};
    si.bindingCount = 1;
    si.pBindings = &operands;
    BLUE_VK_TRY(vkCreateDescriptorSetLayout(dev.device(), &si, nullptr, &p->operand_layout_));
    VkDescriptorSetLayout sets[2] = {p->set_layout_, p->operand_layout_};
    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, BLUE_PUSH_WORDS * 4};
    VkPipelineLayoutCreateInfo li{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    li.setLayoutCount = 2;
    li.pSetLayouts = sets;
    li.pushConstantRangeCount = 1;
    li.pPushConstantRanges = &range;
    BLUE_VK_TRY(vkCreatePipelineLayout(dev.device(), &li, nullptr, &p->layout_));

    std::vector<char> blob;
    if (std::string path = p->cachePath(); !path.empty()) blob = readPipelineCacheFile(path);
    VkPipelineCacheCreateInfo ci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    ci.initialDataSize = blob.size();
    ci.pInitialData = blob.empty() ? nullptr : blob.data();
    if (vkCreatePipelineCache(dev.device(), &ci, nullptr, &p->cache_) != VK_SUCCESS) {
        ci.initialDataSize = 0;  // a corrupt cache file: start empty
        ci.pInitialData = nullptr;
        BLUE_VK_TRY(vkCreatePipelineCache(dev.device(), &ci, nullptr, &p->cache_));
    }
    return p;
}

Result<VkPipeline> Pipelines::get(const std::string& name) {
    if (auto it = pipelines_.find(name); it != pipelines_.end()) return it->second;
    const std::optional<KernelWidth> k = splitKernelWidth(name);
    const EmbeddedShader* shader = k ? findShader(kernelVariant(k->kernel, dev_.info())) : nullptr;
    if (!shader) return BLUE_ERROR("no kernel named '%s' is built into this BlueVM", name.c_str());
    VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    mi.codeSize = shader->words * 4;
    mi.pCode = shader->code;
    VkShaderModule module;
    BLUE_VK_TRY(vkCreateShaderModule(dev_.device(), &mi, nullptr, &module));
    VkComputePipelineCreateInfo pi{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    pi.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    pi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    pi.stage.module = module;
    pi.stage.pName = "main";
    // A width and head quads asked for in the name: the workgroup's lanes and the attention
    // kernels' head size (shaders/blue_config.h BLUE_SPEC_WG, BLUE_SPEC_HEAD_QUADS).
    VkSpecializationMapEntry entries[2];
    uint32_t values[2];
    uint32_t n_spec = 0;
    const std::pair<uint32_t, uint32_t> asked[] = {{BLUE_SPEC_WG, k->width}, {BLUE_SPEC_HEAD_QUADS, k->head_quads}};
    for (const auto& [id, value] : asked) {
        if (value == 0) continue;
        entries[n_spec] = {id, uint32_t(n_spec * 4), 4};
        values[n_spec++] = value;
    }
    VkSpecializationInfo spec{n_spec, entries, n_spec * 4, values};
    if (n_spec != 0) pi.stage.pSpecializationInfo = &spec;
    pi.layout = layout_;
    VkPipeline pipeline = VK_NULL_HANDLE;
    VkResult r = vkCreateComputePipelines(dev_.device(), cache_, 1, &pi, nullptr, &pipeline);
    vkDestroyShaderModule(dev_.device(), module, nullptr);
    BLUE_VK_TRY(r);
    pipelines_[name] = pipeline;
    cache_dirty_ = true;
    return pipeline;
}

void Pipelines::saveCache() {
    std::string path = cachePath();
    if (!cache_dirty_ || path.empty()) return;
    size_t size = 0;
    if (vkGetPipelineCacheData(dev_.device(), cache_, &size, nullptr) != VK_SUCCESS) return;
    std::vector<char> blob(size);
    if (vkGetPipelineCacheData(dev_.device(), cache_, &size, blob.data()) != VK_SUCCESS) return;
    blob.resize(size);
    makeDirs(path.substr(0, path.rfind('/')));
    writePipelineCacheFile(path, blob);
    cache_dirty_ = false;
}

Pipelines::~Pipelines() {
    saveCache();
    for (auto& [name, p] : pipelines_) vkDestroyPipeline(dev_.device(), p, nullptr);
    if (cache_) vkDestroyPipelineCache(dev_.device(), cache_, nullptr);
    if (layout_) vkDestroyPipelineLayout(dev_.device(), layout_, nullptr);
    if (set_layout_) vkDestroyDescriptorSetLayout(dev_.device(), set_layout_, nullptr);
    if (operand_layout_) vkDestroyDescriptorSetLayout(dev_.device(), operand_layout_, nullptr);
}

}  // namespace blue
