u3m_test(test_monitor SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_monitor.cpp LIBS u3m_mem)
