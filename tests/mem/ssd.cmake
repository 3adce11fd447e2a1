# The SSD tier store and its I/O engines (src/mem/ssd.cmake).
u3m_test(test_ssd SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ssd_store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_ssd_faults.cpp ${CMAKE_CURRENT_LIST_DIR}/test_ssd_engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_ssd_verify.cpp ${CMAKE_CURRENT_LIST_DIR}/test_ssd_fault_mix.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_ssd_crash.cpp
  LIBS u3m_mem)
# `u3m bench ssd` end to end (runs the built CLI; U3M_BIN from ctest overrides).
u3m_test(test_ssd_cli SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ssd_cli.cpp
  LIBS u3m_mem nlohmann_json::nlohmann_json)
target_compile_definitions(test_ssd_cli PRIVATE U3M_BIN_PATH="$<TARGET_FILE:u3m>")
add_dependencies(test_ssd_cli u3m)
