// Turns output-ring records into text, per instance: integers and floats in decimal, characters
// as bytes, strings from the constant pool, tokens through an optional detokenizer.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "vm/interp.h"
#include "vm/module.h"

namespace blue {

// Returns the text of one token id; used for BLUE_OUT_TOKEN records.
using Detokenizer = std::function<std::string(uint32_t token)>;

// Text of one record (empty for end-of-response markers).
std::string recordText(const Module& m, const OutputRecord& r, const Detokenizer& detok = {});

// Appends each record's text to its instance's string (instances beyond the vector are ignored).
void appendOutputText(const Module& m, std::span<const OutputRecord> records,
                      std::vector<std::string>* per_instance, const Detokenizer& detok = {});

// The `bluevm run` listing: for each instance with output, each line prefixed "[id] ".
std::string formatInstanceOutput(const std::vector<std::string>& per_instance);

}  // namespace blue
