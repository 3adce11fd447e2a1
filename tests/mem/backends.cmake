# Backend tests: device-emu (memory, copies, streams, events, VMM, failure) and host.
u3m_test(test_backends
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backends.cpp ${CMAKE_CURRENT_LIST_DIR}/test_backends_vmm.cpp
  LIBS u3m_mem)
# The cache of freed pinned host blocks in front of a runtime's allocator (Note [Pinned host cache]).
u3m_test(test_host_cache SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_host_cache.cpp LIBS u3m_mem)
# `u3m bench copy` end to end: U3M_BIN from ctest, else this built-in path.
u3m_test(test_backends_cli
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backends_cli.cpp
  LIBS nlohmann_json::nlohmann_json)
target_compile_definitions(test_backends_cli PRIVATE U3M_BIN_PATH="$<TARGET_FILE:u3m>")
add_dependencies(test_backends_cli u3m)
