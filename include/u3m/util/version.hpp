// The version every report carries: the release and the git commit it was
// built from ("u3m 0.1.0 (git 1a2b3c4d5e6f)", "-dirty" when the tree had
// uncommitted changes, "commit unknown" outside a git checkout). Written at
// build time by src/util/build_info.cmake.
#pragma once

namespace u3m {

extern const char* const kVersion;

}  // namespace u3m
