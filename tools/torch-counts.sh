#!/bin/sh
# tools/torch-counts.sh LASTTEST_LOG — prints each torch test's pytest summary ("Torch.ops: 9 passed in 13.1s") from
# a ctest LastTest.log (build/Testing/Temporary/LastTest.log); prints nothing when the log or the tests are absent.
# .ci/run (torch 1.13) and tools/torch2-root.sh (torch 2.6) put these counts in the CI log.
awk '/ Testing: Torch\./ { n = $3 } /^[0-9]+ (passed|failed|skipped|error)/ && n { print "  " n ": " $0; n = "" }' \
    "${1:?usage: torch-counts.sh LASTTEST_LOG}" 2>/dev/null || true
