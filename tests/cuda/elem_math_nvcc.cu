// Compiles kernels/elem_math.h for the device with nvcc (ctest Kernels.elem_math_compiles_with_nvcc, added when
// nvcc is found): every conversion and operation is used in a kernel, so a construct nvcc rejects in device code
// (or a function that is not __host__ __device__) fails the build of this file. Running it needs no GPU: main only
// checks the host side against three known encodings.
#include <cstdio>
#include "elem_math.h"

__global__ void every_function(const uint8_t *in, uint8_t *out, float dv) {
    const unsigned i = threadIdx.x + blockIdx.x * blockDim.x;
    const float a = zccl_em_e4m3_to_float(in[i]), b = zccl_em_e5m2_to_float(in[i]);
    const float h = zccl_em_half_to_float(zccl_em_float_to_half(a)), g = zccl_em_bf16_to_float(zccl_em_float_to_bf16(b));
    const float r = zccl_em_sumf(zccl_em_prodf(a, b), zccl_em_avgf(h, g, dv)) + zccl_em_maxf(a, b) +
                    zccl_em_minf(a, b) + zccl_em_premulf(a, b);
    out[i] = (uint8_t)(zccl_em_float_to_e4m3(r) ^ zccl_em_float_to_e5m2(r));
}

int main() {
    int bad = 0;
    bad += zccl_em_float_to_e4m3(1.0f) != 0x38;
    bad += zccl_em_float_to_e5m2(1.0f) != 0x3c;
    bad += zccl_em_float_to_half(1.0f) != 0x3c00;
    printf("elem_math host side: %s\n", bad ? "WRONG" : "ok");
    return bad;
}
