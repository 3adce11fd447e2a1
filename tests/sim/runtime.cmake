# The simulator's runtime side: virtual time, modelled links and host, the
# runner (src/sim/runtime.cmake).
u3m_test(test_sim_runtime SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sim_time.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_sim_runner.cpp LIBS u3m_sim)
