# The SSD tier: I/O engines (io_uring, pread/pwrite, fault injection) and the store.
target_sources(u3m_mem PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/io_engine_uring.cpp
  ${CMAKE_CURRENT_LIST_DIR}/io_engine_fault.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_spec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ssd_store.cpp)
target_link_libraries(u3m_mem PUBLIC PkgConfig::URING PkgConfig::XXHASH)

# libxxhash built with DISPATCH=1 (Debian's is) picks the widest SIMD the CPU
# has at run time; the plain XXH3 entry points are the portable SSE2 build,
# 2-3x slower. Same hash values either way. See Note [Checksum speed].
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_LIBRARIES PkgConfig::XXHASH)
check_cxx_source_compiles("
#include <xxhash.h>
#include <xxh_x86dispatch.h>
int main() { return static_cast<int>(XXH3_64bits_withSeed_dispatch(\"x\", 1, 0) & 1); }"
  U3M_HAVE_XXH3_DISPATCH)
unset(CMAKE_REQUIRED_LIBRARIES)
if(U3M_HAVE_XXH3_DISPATCH)
  set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/ssd_store.cpp APPEND PROPERTY
    COMPILE_DEFINITIONS U3M_XXH3_DISPATCH=1)
endif()
