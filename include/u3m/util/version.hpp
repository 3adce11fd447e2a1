// The version every report carries.
#pragma once

namespace u3m {

inline constexpr const char* kVersion = "u3m 0.1.0";

}  // namespace u3m
