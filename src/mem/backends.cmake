# Backends: the device/host interface (backend.hpp), device-emu and host, and
# the accelerator backends found at run time (cuda, acl: dlopen, no link-time
# dependency on any vendor library) with their registry.
target_sources(u3m_mem PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/backend_common.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_emu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend_accel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend_cuda.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend_acl.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend_registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sys_probe.cpp)
target_link_libraries(u3m_mem PUBLIC ${CMAKE_DL_LIBS})
