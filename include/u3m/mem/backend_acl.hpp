// The ACL backend: Huawei Ascend NPUs (910B) through AscendCL (libascendcl),
// opened with dlopen at run time and bound into a function table, as Ascend's
// own memfabric (DlAclApi) does. Memory (aclrtMalloc / aclrtMallocHost),
// copies (aclrtMemcpy / aclrtMemcpyAsync with destMax and the 64-byte rule),
// streams, events, aclrtGetMemInfo, and VMM (aclrtReserveMemAddress /
// aclrtMallocPhysical / aclrtMapMem / aclrtUnmapMem). See
// include/u3m/mem/backend_accel.hpp and docs/accelerators.md.
#pragma once

#include <memory>
#include <string>

#include "u3m/mem/backend_accel.hpp"

namespace u3m::mem {

struct AclOptions {
  int device = 0;
  // A path or soname; empty: $U3M_ACL_LIBRARY, else libascendcl.so, then
  // lib64/libascendcl.so under $ASCEND_HOME_PATH, $ASCEND_TOOLKIT_HOME and
  // /usr/local/Ascend/ascend-toolkit/latest.
  std::string library;
};

// Loads ACL, initialises it (aclInit; an earlier init by someone else in the
// process is fine) and opens the device. On failure *out is untouched and
// `why` is one line.
Status open_acl_backend(const AclOptions& options, std::unique_ptr<AccelBackend>* out,
                        std::string* why);

}  // namespace u3m::mem
