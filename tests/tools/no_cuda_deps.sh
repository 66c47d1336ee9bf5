#!/bin/sh
# no_cuda_deps.sh LIB — fails when LIB links libcuda or libcudart (zccl opens the driver with dlopen; docs/gpu.md).
lib=${1:?usage: no_cuda_deps.sh path/to/libzccl.so}
deps=$(readelf -d "$lib" | grep NEEDED) || { echo "cannot read $lib"; exit 2; }
echo "$deps"
if echo "$deps" | grep -Eq 'libcuda|libcudart|libnvidia'; then
  echo "FAIL: $lib depends on CUDA at load time"; exit 1
fi
if nm -D --undefined-only "$lib" | grep -Eq ' (cu|cuda)[A-Z]'; then
  echo "FAIL: $lib has undefined CUDA symbols:"; nm -D --undefined-only "$lib" | grep -E ' (cu|cuda)[A-Z]'; exit 1
fi
echo "OK: $lib has no CUDA load-time dependency"
