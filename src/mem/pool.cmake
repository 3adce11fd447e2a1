# The device memory pool (caching allocator: pool.cpp; its configuration:
# pool_config.cpp; its free-block index: free_index.cpp; the virtual and host
# segment sources: segment_sources.cpp; the DeviceBackend adapter:
# backend_source.cpp) and the static plan from a trace. See docs/memory.md
# ("Pool allocator").
target_sources(u3m_mem PRIVATE ${CMAKE_CURRENT_LIST_DIR}/pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pool_config.cpp ${CMAKE_CURRENT_LIST_DIR}/free_index.cpp
  ${CMAKE_CURRENT_LIST_DIR}/segment_sources.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend_source.cpp
  ${CMAKE_CURRENT_LIST_DIR}/static_plan.cpp)
target_link_libraries(u3m_mem PUBLIC u3m_trace)
