// transpose: 32x32 tiles through shared memory (33-float padded rows, no bank conflicts), block (32,8),
// each thread moves 4 elements; coalesced reads of X rows and coalesced writes of Y rows; guarded edges.
__global__ void transpose_tiled(const float* __restrict__ X, float* __restrict__ Y, int M, int N) {
    __shared__ float tile[32][33];
    const int bx = blockIdx.x * 32, by = blockIdx.y * 32;
    const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
        int r = by + ty + j, c = bx + tx;  // X[r][c], r < M, c < N
        if (r < M && c < N) tile[ty + j][tx] = __ldg(X + (long long)r * N + c);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
        int r = bx + ty + j, c = by + tx;  // Y[r][c] = X[c][r], r < N, c < M
        if (r < N && c < M) Y[(long long)r * M + c] = tile[tx][ty + j];
    }
}
// kevin: launch transpose_tiled grid=(cdiv(N,32), cdiv(M,32)) block=(32,8) smem=0 args=(X, Y, M, N)
