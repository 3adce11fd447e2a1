# The SSD tier: I/O engines (io_uring, pread/pwrite, fault injection) and the store.
target_sources(u3m_mem PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/io_engine_uring.cpp
  ${CMAKE_CURRENT_LIST_DIR}/io_engine_fault.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ssd_store.cpp)
target_link_libraries(u3m_mem PUBLIC PkgConfig::URING PkgConfig::XXHASH)
