// Mapping from operator names (aten::*, record_function ranges, our generator's
// op names) to the 12 operator classes. The rules live in data/op_classes.tsv,
// compiled into the binary; that file is the documentation of the mapping.
#pragma once

#include <cstddef>
#include <string_view>

#include "u3m/trace/model.hpp"

namespace u3m::trace {

// The class of an op named `name` running in `phase`. Attention ops resolve to
// attn_decode in the decode phase and attn_prefill otherwise. Unknown names
// map to OpClass::other.
OpClass classify_op(std::string_view name, Phase phase);

// Number of rules compiled in from data/op_classes.tsv (tests check it).
std::size_t op_class_rule_count();

}  // namespace u3m::trace
