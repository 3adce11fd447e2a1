# The device memory pool (caching allocator, thread caches, expandable
# segments, segment sources incl. the DeviceBackend adapter) and the static
# plan from a trace. See docs/memory.md ("Pool allocator").
target_sources(u3m_mem PRIVATE ${CMAKE_CURRENT_LIST_DIR}/pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pool_config.cpp ${CMAKE_CURRENT_LIST_DIR}/free_index.cpp
  ${CMAKE_CURRENT_LIST_DIR}/segment_sources.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend_source.cpp
  ${CMAKE_CURRENT_LIST_DIR}/static_plan.cpp)
target_link_libraries(u3m_mem PUBLIC u3m_trace)
# The thread cache's slot lookup (Note [Thread cache] in pool.cpp) without a
# __tls_get_addr call in -fPIC code: TLS descriptors. GCC on x86-64 only
# (clang supports the flag there only from version 19); elsewhere the
# default model is correct, just slower.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/pool.cpp PROPERTIES
    COMPILE_OPTIONS "-mtls-dialect=gnu2")
endif()
