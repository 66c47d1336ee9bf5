#!/bin/sh
# check_exports.sh LIB HEADER [REAL_LIB] — every function NCCL's header declares is exported by LIB under its nccl*
# name and its pnccl* alias, LIB exports nothing else, and its SONAME is libnccl.so.2. With REAL_LIB (NVIDIA's
# libnccl.so.2, only read with nm, never loaded): every nccl*/pnccl* symbol it exports is exported by LIB too
# (the device API's host functions, which nccl.h does not declare, included).
# Exit 77 (skipped) when HEADER is absent.
lib=$1 header=$2 real=$3
if [ ! -f "$header" ]; then
    echo "SKIP: $header is absent (CUDA's NCCL header), so there is no NVIDIA declaration list to check against"
    exit 77
fi
[ -f "$lib" ] || { echo "FAIL: $lib does not exist"; exit 1; }
fail=0
# Declarations as NCCL writes them: return type (ncclResult_t, const char*, void), name, '('.
declared=$(grep -oE '^[[:space:]]*(ncclResult_t|const[[:space:]]+char[[:space:]]*\*|void)[[:space:]]*p?nccl[A-Za-z0-9_]+[[:space:]]*\(' "$header" |
           sed -E 's/^.*[^A-Za-z0-9_](p?nccl[A-Za-z0-9_]+)[[:space:]]*\($/\1/' | sort -u)
n=$(echo "$declared" | grep -c .)
if [ "$n" -lt 40 ]; then echo "FAIL: found only $n declarations in $header: the parser no longer matches it"; exit 1; fi
# Every nccl<Name> also as pnccl<Name>, whether or not the header spells the alias out.
want=$( (echo "$declared"; echo "$declared" | sed -n 's/^nccl/pnccl/p') | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWiV]$/ {print $3}' | sed 's/@.*//' | sort -u)
for f in $want; do
    if ! echo "$exported" | grep -qx "$f"; then echo "FAIL: $f is declared in $header but not exported by $lib"; fail=1; fi
done
extra=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | grep -vE '^p?nccl' | grep -v '^$')
if [ -n "$extra" ]; then echo "FAIL: $lib exports symbols outside NCCL's API:"; echo "$extra"; fail=1; fi
if [ -n "$real" ] && [ -f "$real" ]; then
    for f in $(nm -D --defined-only "$real" | awk '{print $3}' | sed 's/@.*//' | grep -E '^p?nccl'); do
        if ! echo "$exported" | grep -qx "$f"; then echo "FAIL: $f is exported by $real but not by $lib"; fail=1; fi
    done
    echo "checked against the exports of $real"
fi
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
if [ "$soname" != "libnccl.so.2" ]; then echo "FAIL: SONAME is '$soname', not libnccl.so.2"; fail=1; fi
[ $fail -eq 0 ] && echo "OK: $(echo "$want" | grep -c .) functions ($n declared in $header) exported, SONAME $soname"
exit $fail
