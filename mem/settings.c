/*
 * settings.c — the memory layer's rows of the ZCCL_* settings table (docs/configuration.md, docs/gpu.md).
 */
#include "mem.h"

ZCCL_SETTING(zccl__set_cuda_library) = {.name = "ZCCL_CUDA_LIBRARY", .deflt = "libcuda.so.1",
        .help = "the CUDA driver library zccl opens (dlopen) on the first call that may touch device memory"};
