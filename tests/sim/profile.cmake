# Hardware profiles, the roofline cost model and calibrate's pieces (src/sim/profile.cmake).
u3m_test(test_hw_profile SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_profile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_cost.cpp ${CMAKE_CURRENT_LIST_DIR}/test_calibrate.cpp
  LIBS u3m_sim nlohmann_json::nlohmann_json)
# `u3m hw show|calibrate` end to end (runs the built CLI).
u3m_test(test_hw_cli SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hw_cli.cpp
  LIBS u3m_sim nlohmann_json::nlohmann_json)
target_compile_definitions(test_hw_cli PRIVATE U3M_BIN_PATH="$<TARGET_FILE:u3m>")
add_dependencies(test_hw_cli u3m)
