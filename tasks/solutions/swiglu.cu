// Single fused elementwise pass: Y = silu(G) * U (float4 vectorised, precise expf).
// kevin: launch swiglu grid=(cdiv(M*N,1024)) block=(256) smem=0 args=(G, U, Y, M, N)

__device__ __forceinline__ float op(float g_v, float u_v) {
    return g_v / (1.f + expf(-g_v)) * u_v;
}

// Each thread handles 4 consecutive elements of the flattened [M, N] array: one float4 when
// N % 4 == 0 (the 4 elements then share a row and are 16-byte aligned), else 4 guarded scalars.
__global__ void __launch_bounds__(256) swiglu(const float* __restrict__ G, const float* __restrict__ U, float* __restrict__ Y, int M, int N) {
    const long long total = (long long)M * N;
    const long long e0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (e0 >= total) return;
    if ((N & 3) == 0) {
        const float4 G4 = __ldg(reinterpret_cast<const float4*>(G + e0));
        const float4 U4 = __ldg(reinterpret_cast<const float4*>(U + e0));
        float4 o;
        o.x = op(G4.x, U4.x);
        o.y = op(G4.y, U4.y);
        o.z = op(G4.z, U4.z);
        o.w = op(G4.w, U4.w);
        *reinterpret_cast<float4*>(Y + e0) = o;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const long long e = e0 + j;
            if (e < total) {
                Y[e] = op(__ldg(G + e), __ldg(U + e));
            }
        }
    }
}
