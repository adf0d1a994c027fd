// SPIR-V of every BlueVM kernel, compiled from shaders/*.comp at build time and embedded.
#pragma once

#include <cstddef>
#include <cstdint>

namespace blue {

struct EmbeddedShader {
    const char* name;  // file name without .comp, plus a _variant suffix for variants
    const uint32_t* code;
    size_t words;
};

extern const EmbeddedShader kEmbeddedShaders[];
extern const size_t kEmbeddedShaderCount;

}  // namespace blue
