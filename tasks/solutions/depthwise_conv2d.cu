// depthwise_conv2d: 3x3 kernel, padding 1, one filter per channel (32 channels). A 32x8 block
// computes a 32x8 output tile of one (image, channel) plane from a 34x10 shared-memory window
// (zero outside the image: the padding); the channel's 9 weights and bias live in registers.

#define TX 32
#define TY 8
#define CH 32

__global__ void __launch_bounds__(TX * TY)
depthwise3x3(const float* __restrict__ X, const float* __restrict__ Wt, const float* __restrict__ b,
             float* __restrict__ Y, int H, int W) {
    __shared__ float xs[TY + 2][TX + 2];
    const int plane = blockIdx.z, c = plane % CH;
    const float* xp = X + (long long)plane * H * W;
    const int x0 = blockIdx.x * TX - 1, y0 = blockIdx.y * TY - 1;
    const int tid = threadIdx.y * TX + threadIdx.x;
    for (int i = tid; i < (TY + 2) * (TX + 2); i += TX * TY) {
        int r = i / (TX + 2), q = i % (TX + 2), iy = y0 + r, ix = x0 + q;
        xs[r][q] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? __ldg(xp + (long long)iy * W + ix) : 0.0f;
    }
    float w[9];
#pragma unroll
    for (int t = 0; t < 9; ++t) w[t] = __ldg(Wt + c * 9 + t);
    __syncthreads();
    const int ox = blockIdx.x * TX + threadIdx.x, oy = blockIdx.y * TY + threadIdx.y;
    if (ox >= W || oy >= H) return;
    float acc = __ldg(b + c);
#pragma unroll
    for (int ky = 0; ky < 3; ++ky)
#pragma unroll
        for (int kx = 0; kx < 3; ++kx) acc = fmaf(xs[threadIdx.y + ky][threadIdx.x + kx], w[ky * 3 + kx], acc);
    Y[(long long)plane * H * W + (long long)oy * W + ox] = acc;
}
// kevin: launch depthwise3x3 grid=(cdiv(W,32), cdiv(H,8), N*32) block=(32,8) smem=0 args=(X, Wt, b, Y, H, W)
