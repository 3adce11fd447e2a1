# Owned by the KV helper: the tiered KV cache for generation (python/u3m/kv_cache.py) and
# examples/generate_llama_tiny.py. Included from tests/python/CMakeLists.txt; registered only
# where the extension is built (release builds).
if(TARGET u3m_python)
  add_test(NAME python_generate
    COMMAND ${U3M_PYTHON} -m unittest discover -s ${CMAKE_CURRENT_SOURCE_DIR} -p test_generate.py -v)
  set_tests_properties(python_generate PROPERTIES
    ENVIRONMENT "PYTHONPATH=${U3M_PYTHON_PACKAGE_DIR};PYTHONDONTWRITEBYTECODE=1;U3M_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    LABELS python
    TIMEOUT 300)
  # The remote KV tier on Redis (issue 21): separate processes share a prefix through a
  # redis-server the test starts on loopback; the server killed or paused mid-run.
  add_test(NAME python_remote_kv
    COMMAND ${U3M_PYTHON} -m unittest discover -s ${CMAKE_CURRENT_SOURCE_DIR} -p test_remote_kv.py -v)
  set_tests_properties(python_remote_kv PROPERTIES
    ENVIRONMENT "PYTHONPATH=${U3M_PYTHON_PACKAGE_DIR};PYTHONDONTWRITEBYTECODE=1"
    LABELS python
    TIMEOUT 300)
endif()
