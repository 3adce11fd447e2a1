# Hardware profiles (data/hw/*.toml, compiled in), the roofline cost model and
# `u3m hw calibrate`'s measurements. TOML is read through u3m/util/toml.hpp.

# Every data/hw/NAME.toml becomes built-in profile NAME, so `make demo` reads
# no file at run time. Re-globbed at build time (CONFIGURE_DEPENDS).
file(GLOB U3M_HW_PROFILES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/data/hw/*.toml)
list(SORT U3M_HW_PROFILES)
set(U3M_HW_ENTRIES "")
foreach(profile IN LISTS U3M_HW_PROFILES)
  get_filename_component(stem ${profile} NAME_WLE)
  file(READ ${profile} text)
  string(FIND "${text}" ")u3m_toml" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${profile} contains ')u3m_toml', the raw-string delimiter used to embed it")
  endif()
  string(APPEND U3M_HW_ENTRIES "    {\"${stem}\", R\"u3m_toml(${text})u3m_toml\"},\n")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${profile})
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/hw_profiles_data.cpp.in
  ${CMAKE_CURRENT_BINARY_DIR}/hw_profiles_data.cpp @ONLY)

target_sources(u3m_sim PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/profile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cost.cpp
  ${CMAKE_CURRENT_LIST_DIR}/calibrate.cpp
  ${CMAKE_CURRENT_BINARY_DIR}/hw_profiles_data.cpp)
# calibrate measures the device-emu backend and the SSD store.
target_link_libraries(u3m_sim PUBLIC u3m_mem)
