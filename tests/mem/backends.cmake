# Backend tests: device-emu (memory, copies, streams, events, VMM, failure) and host.
u3m_test(test_backends
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backends.cpp ${CMAKE_CURRENT_LIST_DIR}/test_backends_vmm.cpp
  LIBS u3m_mem)
# `u3m bench copy` end to end: U3M_BIN from ctest, else this built-in path.
u3m_test(test_backends_cli
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backends_cli.cpp
  LIBS nlohmann_json::nlohmann_json)
target_compile_definitions(test_backends_cli PRIVATE U3M_BIN_PATH="$<TARGET_FILE:u3m>")
add_dependencies(test_backends_cli u3m)
