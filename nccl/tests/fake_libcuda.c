/*
 * fake_libcuda.c — a stand-in for the CUDA driver (SONAME libcuda.so.1) for the device-pointer test: it exports
 * only cuPointerGetAttribute, and says that the FAKE_DEVICE_BYTES bytes at fake_device_memory are device memory
 * and that every other pointer is unknown to CUDA (CUDA_ERROR_INVALID_VALUE), as the driver does for host memory.
 */
#include <stdint.h>

#define FAKE_DEVICE_BYTES 4096
__attribute__((visibility("default"))) char fake_device_memory[FAKE_DEVICE_BYTES];

__attribute__((visibility("default"))) int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) {
    enum { ATTR_MEMORY_TYPE = 2, ATTR_IS_MANAGED = 8, MEMTYPE_DEVICE = 2, ERROR_INVALID_VALUE = 1 };
    uintptr_t lo = (uintptr_t)fake_device_memory;
    if (ptr < lo || ptr >= lo + FAKE_DEVICE_BYTES) return ERROR_INVALID_VALUE;
    if (attribute == ATTR_MEMORY_TYPE) *(unsigned int *)data = MEMTYPE_DEVICE;
    else if (attribute == ATTR_IS_MANAGED) *(unsigned int *)data = 0;
    else return ERROR_INVALID_VALUE;
    return 0;
}
