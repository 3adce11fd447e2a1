# The simulator's runtime side (issue 5): virtual time, modelled links and
# host, and the runner that drives a trace through the real engine.
target_sources(u3m_sim PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/virtual_time.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim_transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim_host.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim_stack.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runner.cpp)
target_link_libraries(u3m_sim PUBLIC u3m_drive u3m_engine u3m_predict u3m_policy)
