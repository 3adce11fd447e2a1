# Backends: the device/host interface (backend.hpp), device-emu and host.
target_sources(u3m_mem PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/backend_common.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_emu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host.cpp)
