# End-to-end check of `u3m predict eval` (bad input, JSON shape), run against
# the built binary. Kept here rather than in tests/cli/ so the predict layer
# owns its CLI test.
add_test(NAME cli_predict COMMAND ${PROJECT_SOURCE_DIR}/tests/cli/test_predict_cli.sh)
set_tests_properties(cli_predict PROPERTIES ENVIRONMENT "U3M_BIN=$<TARGET_FILE:u3m>" TIMEOUT 300)
