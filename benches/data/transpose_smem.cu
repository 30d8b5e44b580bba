// kernels: transpose
// Out[N,M] = In[M,N]^T through a padded 32x32 shared tile (coalesced both ways).
#define T 32
#define ROWS 8
extern "C" __global__ void transpose(const float* __restrict__ in, float* __restrict__ out, int m, int n) {
    __shared__ float tile[T][T + 1];
    int x = blockIdx.x * T + threadIdx.x, y = blockIdx.y * T + threadIdx.y;
    for (int j = 0; j < T; j += ROWS)
        if (x < n && y + j < m) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * n + x];
    __syncthreads();
    x = blockIdx.y * T + threadIdx.x;
    y = blockIdx.x * T + threadIdx.y;
    for (int j = 0; j < T; j += ROWS)
        if (x < m && y + j < n) out[(y + j) * m + x] = tile[threadIdx.x][threadIdx.y + j];
}
