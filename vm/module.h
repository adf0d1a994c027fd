// The .bir module: Blue-IR's container format, in memory and on disk.
//
// On disk (little endian): a 32-byte header, a section table, then the sections.
//
//   offset 0   "BLIR"            magic
//          4   u16 major, minor  format version (this code writes 1.0, or 1.1 for a module with
//                                custom kernels, and reads major 1)
//          8   u32 section count
//         12   u32 flags         must be 0
//         16   u64 file size     must equal the real size
//         24   u64 reserved      must be 0
//         32   section table: count x {u32 id, u32 flags(0), u64 offset, u64 size}
//
// Section payloads are 8-byte aligned (DATA 64-byte), inside the file, non-overlapping, each id at
// most once. Strings inside sections are {u32 length, bytes, zero padding to 4}.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vm/dtype.h"
#include "vm/kernel.h"
#include "vm/status.h"

namespace blue {

constexpr uint16_t kModuleMajor = 1;
constexpr uint16_t kModuleMinor = 0;
// Minor version of a module that carries custom kernels (section KERNELS, opcode KERNEL): a 1.0
// reader refuses its unknown section by name instead of running a module it cannot run.
constexpr uint16_t kModuleMinorKernels = 1;

enum class SectionId : uint32_t {
    LAYOUT = 1,   // Layout: 11 u32 words
    CODE = 2,     // control code, 2 words per instruction
    CONST = 3,    // constant pool (u32 words; strings as {len, bytes})
    BLOCKS = 4,   // block table
    TCODE = 5,    // tensor instruction stream (blocks point into it)
    TENSORS = 6,  // tensor table
    EXTERN = 7,   // external data files (paths relative to the module's folder)
    DATA = 8,     // embedded tensor data
    META = 10,    // key/value strings
    SYMS = 11,    // names of labels, constants and strings (for the disassembler)
    KERNELS = 12, // custom kernels: {u32 count, then per kernel {string name, u32 words, SPIR-V}}
};

// Per-instance resources and machine parameters, laid out by the compiler.
struct Layout {
    uint32_t regs = 32;          // 32-bit registers per instance
    uint32_t local_words = 0;    // private memory per instance
    uint32_t heap_words = 0;     // memory shared by all instances
    uint32_t heap_static = 0;    // heap words at fixed addresses; ALLOC hands out the rest
    uint32_t stack_depth = 16;   // call stack entries per instance
    uint32_t mailbox_cap = 4;    // mailbox queue length per instance
    uint32_t in_slots = 0;       // input ring slots (0: the program reads no input)
    uint32_t in_slot_words = 0;  // words per input slot (message length word included)
    uint32_t max_rows = 0;       // rows a block can take per cycle (0: no blocks)
    uint32_t max_steps = 4096;   // control instructions an instance runs per cycle at most
    uint32_t entry = 0;          // first instruction
};

struct BlockDecl {
    std::string name;
    uint32_t tcode_offset = 0;  // first word in TCODE
    uint32_t tcode_words = 0;
    uint32_t nargs = 0;  // registers passed by RUN (at most BLUE_MAX_BLOCK_ARGS)
};

enum class DataSource : uint32_t { NONE = 0, DATA = 1, EXTERN = 2 };

struct TensorDecl {
    std::string name;
    DType dtype = DType::F32;
    uint32_t cls = 0;  // BLUE_TC_*
    uint32_t ndim = 1;
    std::array<uint64_t, 4> ne{1, 1, 1, 1};  // ne[0] is the innermost (row) length
    DataSource source = DataSource::NONE;
    uint32_t extern_index = 0;
    uint64_t offset = 0;  // into DATA or the external file
    uint64_t bytes = 0;   // stored size (must equal the size the shape implies)

    uint64_t elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    uint64_t rowElements() const { return ne[0]; }
};

enum class SymKind : uint32_t { LABEL = 1, CONST = 2, STRING = 3 };

struct Symbol {
    SymKind kind = SymKind::LABEL;
    uint32_t value = 0;
    std::string name;
};

struct Module {
    uint16_t major = kModuleMajor;
    uint16_t minor = kModuleMinor;
    Layout layout;
    std::vector<uint32_t> code;
    std::vector<uint32_t> consts;
    std::vector<BlockDecl> blocks;
    std::vector<uint32_t> tcode;
    std::vector<TensorDecl> tensors;
    std::vector<std::string> externs;
    std::vector<uint8_t> data;
    std::vector<std::pair<std::string, std::string>> meta;
    std::vector<Symbol> syms;
    std::vector<KernelDecl> kernels;  // custom kernels, run by KERNEL (vm/kernel.h)

    uint32_t instrCount() const { return uint32_t(code.size() / 2); }
    // Returns the string stored at a constant-pool word offset, if one fits there.
    bool constString(uint32_t offset, std::string* out) const;
    // Appends a string to the constant pool and returns its word offset.
    uint32_t addConstString(std::string_view s);
    const std::string* metaValue(std::string_view key) const;
};

// Serializes a module to bytes. The module should have passed verifyModule().
std::vector<uint8_t> serializeModule(const Module& m);

// Parses bytes into a module, checking structure (header, section bounds, record sizes, counts).
// `name` prefixes error messages. Semantic checks are verifyModule()'s job (vm/verify.h).
Result<Module> parseModule(std::span<const uint8_t> bytes, const std::string& name);

// Reads and parses a file (no verification).
Result<Module> readModuleFile(const std::string& path);
Status writeModuleFile(const Module& m, const std::string& path);

}  // namespace blue
