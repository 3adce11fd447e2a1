// Whole-file reads with clear errors. Gzip input (by magic bytes, not by name)
// is decompressed transparently; a truncated or corrupt gzip is an InputError.
#pragma once

#include <string>

namespace u3m {

std::string read_file(const std::string& path);
// Throws InputError naming the path unless it is an existing regular file.
void require_regular_file(const std::string& path);
bool is_gzip_file(const std::string& path);

}  // namespace u3m
