# The memory monitor (levels and time to OOM). See docs/runtime.md.
target_sources(u3m_mem PRIVATE ${CMAKE_CURRENT_LIST_DIR}/monitor.cpp)
