# Pool allocator and static plan tests (src/mem/pool*.cpp, free_index.cpp,
# segment_sources.cpp, static_plan.cpp).
u3m_test(test_pool
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pool.cpp ${CMAKE_CURRENT_LIST_DIR}/test_pool_stress.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_static_plan.cpp
  LIBS u3m_mem u3m_workload)
# The pool over a DeviceBackend (src/mem/backend_source.cpp, over device-emu).
u3m_test(test_backend_source
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_source.cpp
  LIBS u3m_mem)
# `u3m bench alloc` end to end: U3M_BIN from ctest, else this built-in path.
u3m_test(test_pool_cli
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pool_cli.cpp
  LIBS u3m_mem nlohmann_json::nlohmann_json)
target_compile_definitions(test_pool_cli PRIVATE U3M_BIN_PATH="$<TARGET_FILE:u3m>")
add_dependencies(test_pool_cli u3m)
