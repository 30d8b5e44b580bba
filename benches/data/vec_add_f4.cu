// kernels: vec_add_f4
// Elementwise add, vectorised with float4 loads; scalar tail.
extern "C" __global__ void vec_add_f4(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int n) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n) {
        float4 x = *reinterpret_cast<const float4*>(a + i);
        float4 y = *reinterpret_cast<const float4*>(b + i);
        *reinterpret_cast<float4*>(c + i) = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    } else {
        for (; i < n; ++i) c[i] = a[i] + b[i];
    }
}
