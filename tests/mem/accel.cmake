# Accelerator backends (cuda, acl) against in-repo test doubles of their C
# APIs (tests/mem/doubles): shared libraries the backends dlopen through their
# override path, so CI checks loading, binding, error mapping and ordering
# without hardware. Each double gets its own copy of the core (its state is
# per library) and exports only the C API and the control API.
set(U3M_DOUBLES ${CMAKE_CURRENT_LIST_DIR}/doubles)
foreach(api cuda acl)
  add_library(u3m_${api}_double SHARED ${U3M_DOUBLES}/${api}_double.cpp
    ${U3M_DOUBLES}/fake_device.cpp ${U3M_DOUBLES}/double_control.cpp)
  set_target_properties(u3m_${api}_double PROPERTIES CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_libraries(u3m_${api}_double PRIVATE Threads::Threads)
  # A double stands in for an uninstrumented C library: the backend calls it
  # through dlsym'd pointers whose C++ parameter types are the backend's own
  # declarations of the C structs, so UBSan's function-type check (clang's
  # -fsanitize=function, part of the asan preset) would flag every struct-taking
  # call, which a vendor library (no check prologue) never does.
  if(U3M_SANITIZE STREQUAL "address" AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_options(u3m_${api}_double PRIVATE -fno-sanitize=function)
  endif()
endforeach()

# The conformance suite (test_backend_accel.cpp) runs in each backend's test
# next to that backend's own cases. U3M_CUDA_TEST_REAL=1 points the CUDA one
# at the real runtime (scripts/gpu-check.sh).
u3m_test(test_backend_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_accel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_backend_cuda.cpp LIBS u3m_mem ${CMAKE_DL_LIBS})
u3m_test(test_backend_acl SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_accel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_backend_acl.cpp LIBS u3m_mem ${CMAKE_DL_LIBS})
foreach(t test_backend_cuda test_backend_acl)
  target_compile_definitions(${t} PRIVATE U3M_CUDA_DOUBLE="$<TARGET_FILE:u3m_cuda_double>"
    U3M_ACL_DOUBLE="$<TARGET_FILE:u3m_acl_double>")
  add_dependencies(${t} u3m_cuda_double u3m_acl_double)
endforeach()
target_compile_definitions(test_backend_cuda PRIVATE U3M_OTHER_DOUBLE="$<TARGET_FILE:u3m_acl_double>")
target_compile_definitions(test_backend_acl PRIVATE U3M_OTHER_DOUBLE="$<TARGET_FILE:u3m_cuda_double>")

# The CLI tests of `bench copy --backend` and `doctor` reach the doubles through
# the environment variables.
foreach(t test_backends_cli)
  target_compile_definitions(${t} PRIVATE U3M_CUDA_DOUBLE="$<TARGET_FILE:u3m_cuda_double>"
    U3M_ACL_DOUBLE="$<TARGET_FILE:u3m_acl_double>")
  add_dependencies(${t} u3m_cuda_double u3m_acl_double)
endforeach()
