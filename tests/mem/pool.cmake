# Pool allocator and static plan tests (src/mem/pool.cpp, static_plan.cpp).
u3m_test(test_pool
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pool.cpp ${CMAKE_CURRENT_LIST_DIR}/test_pool_stress.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_static_plan.cpp
  LIBS u3m_mem u3m_workload)
