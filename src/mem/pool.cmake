# The device memory pool (caching allocator, thread caches, expandable
# segments, segment sources incl. the DeviceBackend adapter) and the static
# plan from a trace. See docs/memory.md ("Pool allocator").
target_sources(u3m_mem PRIVATE ${CMAKE_CURRENT_LIST_DIR}/pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend_source.cpp
  ${CMAKE_CURRENT_LIST_DIR}/static_plan.cpp)
target_link_libraries(u3m_mem PUBLIC u3m_trace)
