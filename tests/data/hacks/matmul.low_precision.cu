// Computes an fp32 matmul from fp16-rounded inputs (the "tensor cores are faster" shortcut): each
// product loses about 11 bits, far outside the fp32 tolerance of 1e-4.
// kevin: launch matmul_half grid=(cdiv(N,16), cdiv(M,16)) block=(16,16) args=(A, B, C, M, N, K)
#include <cuda_fp16.h>
__global__ void matmul_half(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                            int M, int N, int K) {
    const int r = blockIdx.y * 16 + threadIdx.y, c = blockIdx.x * 16 + threadIdx.x;
    if (r >= M || c >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
        __half a = __float2half(A[(long long)r * K + k]);
        __half b = __float2half(B[(long long)k * N + c]);
        acc += __half2float(__hmul(a, b));
    }
    C[(long long)r * N + c] = acc;
}
