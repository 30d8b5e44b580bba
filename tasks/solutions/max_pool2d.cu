// max_pool2d: 3x3 window, stride 2, padding 1 (padding never wins: it is skipped, as PyTorch's
// -inf padding). One thread per output element over the flattened [N*C, Ho, Wo] output; the
// window's rows are read through the read-only cache, which neighbouring outputs share. NaN
// propagates, as in PyTorch.

__global__ void max_pool3x3_s2p1(const float* __restrict__ X, float* __restrict__ Y, long long planes,
                                 int H, int W, int Ho, int Wo) {
    const long long total = planes * Ho * Wo;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int ox = (int)(i % Wo);
        const int oy = (int)((i / Wo) % Ho);
        const long long p = i / ((long long)Wo * Ho);
        const float* xp = X + p * H * W;
        float m = __int_as_float(0xff800000);  // -inf
#pragma unroll
        for (int ky = 0; ky < 3; ++ky) {
            const int iy = oy * 2 - 1 + ky;
            if (iy < 0 || iy >= H) continue;
#pragma unroll
            for (int kx = 0; kx < 3; ++kx) {
                const int ix = ox * 2 - 1 + kx;
                if (ix < 0 || ix >= W) continue;
                const float v = __ldg(xp + (long long)iy * W + ix);
                m = (v > m || isnan(v)) ? v : m;
            }
        }
        Y[i] = m;
    }
}
// kevin: launch max_pool3x3_s2p1 grid=(cdiv(N*C*((H-1)/2+1)*((W-1)/2+1),256)) block=(256) smem=0 args=(X, Y, N*C, H, W, (H-1)/2+1, (W-1)/2+1)
