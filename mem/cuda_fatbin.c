/*
 * cuda_fatbin.c — embeds the nvcc fatbin of kernels/cuda/ (sm_80, sm_90 and PTX; CMake builds it when ZCCL_WITH_CUDA
 * finds nvcc) as the symbol zccl__cuda_fatbin, which mem_cuda.c hands to cuModuleLoadData. Empty otherwise.
 */
#ifdef ZCCL_HAVE_CUDA_KERNELS
__asm__(".section .rodata.zccl_cuda_fatbin,\"a\"\n"
        ".balign 64\n"
        ".globl zccl__cuda_fatbin\n"
        ".hidden zccl__cuda_fatbin\n"
        ".type zccl__cuda_fatbin, @object\n"
        "zccl__cuda_fatbin:\n"
        ".incbin \"" ZCCL_CUDA_FATBIN_PATH "\"\n"
        ".byte 0\n"
        ".previous\n");
#endif
typedef int zccl_cuda_fatbin_unit_not_empty;
