# Owned by the report helper: `u3m report` (python/u3m_report) and `u3m plan cost` end to end,
# with the report rendered in headless Chromium (Debian's chromium, scripts/install-deps.sh).
# Included from tests/python/CMakeLists.txt.
add_test(NAME python_report
  COMMAND ${U3M_PYTHON} -m unittest discover -s ${CMAKE_CURRENT_SOURCE_DIR} -p test_report.py -v)
set_tests_properties(python_report PROPERTIES
  ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;PYTHONDONTWRITEBYTECODE=1;U3M_BIN=$<TARGET_FILE:u3m>"
  LABELS python
  TIMEOUT 300)
