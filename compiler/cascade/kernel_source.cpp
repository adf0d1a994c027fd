// Loading and compiling custom kernels (see kernel_source.h). glslang runs in-process through its
// C interface; its process-wide state is initialised once.
#include "compiler/cascade/kernel_source.h"

#include <glslang/Include/glslang_c_interface.h>
#include <glslang/Public/resource_limits_c.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>

#include "vm/kernel.h"
#include "vm/kernel_abi.h"

namespace blue {

namespace {

constexpr size_t kMaxSourceBytes = 1 << 20;

// glslang's first "ERROR: 0:LINE: message" as "FILE:LINE: message" (its string 0 is the file).
std::string firstError(const char* log, const std::string& file) {
    std::string s = log ? log : "";
    size_t at = s.find("ERROR: ");
    if (at == std::string::npos)
        at = 0;
    else
        at += 7;
    std::string line = s.substr(at, s.find('\n', at) - at);
    if (line.compare(0, 2, "0:") == 0) return file + ":" + line.substr(2);
    return file + ": " + (line.empty() ? "glslang failed without a message" : line);
}

}  // namespace

Result<std::vector<uint32_t>> compileGlslKernel(std::string_view source, const std::string& file) {
    static std::once_flag once;
    std::call_once(once, [] { glslang_initialize_process(); });
    std::string text(source);
    glslang_input_t in{};
    in.language = GLSLANG_SOURCE_GLSL;
    in.stage = GLSLANG_STAGE_COMPUTE;
    in.client = GLSLANG_CLIENT_VULKAN;
    in.client_version = GLSLANG_TARGET_VULKAN_1_2;
    in.target_language = GLSLANG_TARGET_SPV;
    in.target_language_version = GLSLANG_TARGET_SPV_1_5;
    in.code = text.c_str();
    in.default_version = 450;
    in.default_profile = GLSLANG_NO_PROFILE;
    in.messages = glslang_messages_t(GLSLANG_MSG_SPV_RULES_BIT | GLSLANG_MSG_VULKAN_RULES_BIT);
    in.resource = glslang_default_resource();
    glslang_shader_t* shader = glslang_shader_create(&in);
    Status status = Status::ok();
    glslang_program_t* program = nullptr;
    std::vector<uint32_t> words;
    if (!glslang_shader_preprocess(shader, &in) || !glslang_shader_parse(shader, &in)) {
        status = BLUE_ERROR("%s", firstError(glslang_shader_get_info_log(shader), file).c_str());
    } else {
        program = glslang_program_create();
        glslang_program_add_shader(program, shader);
        if (!glslang_program_link(program, in.messages)) {
            status =
                BLUE_ERROR("%s", firstError(glslang_program_get_info_log(program), file).c_str());
        } else {
            glslang_program_SPIRV_generate(program, GLSLANG_STAGE_COMPUTE);
            words.resize(glslang_program_SPIRV_get_size(program));
            glslang_program_SPIRV_get(program, words.data());
        }
    }
    if (program) glslang_program_delete(program);
    glslang_shader_delete(shader);
    if (!status) return status;
    return words;
}

Result<std::vector<uint32_t>> loadKernelFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return BLUE_ERROR("%s: cannot open the kernel file", path.c_str());
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (bytes.size() > kMaxSourceBytes * 4)
        return BLUE_ERROR("%s: the kernel file is larger than 4 MiB", path.c_str());
    std::vector<uint32_t> words;
    bool spv = path.size() >= 4 && path.compare(path.size() - 4, 4, ".spv") == 0;
    if (spv) {
        if (bytes.size() % 4) {
            return BLUE_ERROR("%s: not SPIR-V: %zu bytes is not a whole number of 32-bit words",
                              path.c_str(), bytes.size());
        }
        words.resize(bytes.size() / 4);
        if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
    } else {
        if (bytes.size() > kMaxSourceBytes)
            return BLUE_ERROR("%s: GLSL source larger than 1 MiB", path.c_str());
        BLUE_TRY_ASSIGN(words, compileGlslKernel(bytes, path));
    }
    auto shape = checkKernelSpirv(words, path);
    if (!shape) return shape.status();
    return words;
}

}  // namespace blue
