#!/bin/sh
# check_docs.sh HEADER DOC — DOC's table has a row for every function HEADER declares. Exit 77 if HEADER is absent.
header=$1 doc=$2
[ -f "$header" ] || { echo "SKIP: $header is absent (CUDA's NCCL header)"; exit 77; }
fail=0 n=0
for f in $(grep -oE '^[[:space:]]*(ncclResult_t|const[[:space:]]+char[[:space:]]*\*|void)[[:space:]]*nccl[A-Za-z0-9_]+[[:space:]]*\(' "$header" |
           sed -E 's/^.*[^A-Za-z0-9_](nccl[A-Za-z0-9_]+)[[:space:]]*\($/\1/' | sort -u); do
    n=$((n + 1))
    grep -q "^| \`$f\` |" "$doc" || { echo "FAIL: $f (declared in $header) has no row in $doc"; fail=1; }
done
[ $fail -eq 0 ] && echo "OK: $doc has a row for each of the $n functions of $header"
exit $fail
