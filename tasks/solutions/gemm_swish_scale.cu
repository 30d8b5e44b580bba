// Fused FFMA SGEMM (128x128x8 tiles, 8x8 per thread) with bias, SiLU and *2 in registers before the store.
// kevin: launch gemm_swish_scale grid=(cdiv(N,128), cdiv(M,128)) block=(256) smem=0 args=(A, W, b, Y, M, N, K)

// ---- fp32 SGEMM block core: 128x128x8 tile, 256 threads, 8x8 outputs per thread (FFMA, no TF32),
// double-buffered shared memory with register prefetch; every tail is guarded (zero fill).
#define BM 128
#define BN 128
#define BK 8

// v[0..3] = P[r][c..c+3] of a row-major [rows, cols] matrix, zero outside it.
// vec: cols % 4 == 0 (then c % 4 == 0 and c < cols imply c + 3 < cols).
__device__ __forceinline__ void ld4(const float* __restrict__ P, int rows, int cols, int r, int c,
                                    bool vec, float v[4]) {
    v[0] = v[1] = v[2] = v[3] = 0.f;
    if (r < rows) {
        const float* p = P + (size_t)r * cols + c;
        if (vec) {
            if (c < cols) {
                float4 t = __ldg(reinterpret_cast<const float4*>(p));
                v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (c + i < cols) v[i] = __ldg(p + i);
        }
    }
}

// Y[r][c..c+3] = v (row-major [rows, cols]), guarded.
__device__ __forceinline__ void st4(float* Y, int rows, int cols, int r, int c, bool vec,
                                    const float v[4]) {
    if (r >= rows) return;
    float* p = Y + (size_t)r * cols + c;
    if (vec) {
        if (c < cols) *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (c + i < cols) p[i] = v[i];
    }
}

// acc[i][j] = sum_k A[m0+row(i)][k] * B'[k][n0+col(j)], where B' = B ([K,N]) or, with BT,
// B' = B^T for B stored [N,K]. row(i) = (i<4 ? ty*4+i : 64+ty*4+i-4), same for col(j) with tx.
template <bool BT>
__device__ __forceinline__ void sgemm_block(const float* __restrict__ A, const float* __restrict__ B,
                                            int M, int N, int K, int m0, int n0, float acc[8][8]) {
    __shared__ __align__(16) float As[2][BK][BM];
    __shared__ __align__(16) float Bs[2][BK][BN];
    const int tid = threadIdx.x;
    const int tx = tid & 15, ty = tid >> 4;
    const bool vecK = (K & 3) == 0;
    const bool vecN = (N & 3) == 0;
    const int ar = tid >> 1, ak = (tid & 1) * 4;       // A tile (and B tile when BT): row, k
    const int bk = tid >> 5, bn = (tid & 31) * 4;      // B tile when !BT: k, n
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    float ra[4], rb[4];
    ld4(A, M, K, m0 + ar, ak, vecK, ra);
    if (BT) ld4(B, N, K, n0 + ar, ak, vecK, rb);
    else    ld4(B, K, N, bk, n0 + bn, vecN, rb);
#pragma unroll
    for (int i = 0; i < 4; ++i) As[0][ak + i][ar] = ra[i];
    if (BT) {
#pragma unroll
        for (int i = 0; i < 4; ++i) Bs[0][ak + i][ar] = rb[i];
    } else {
        *reinterpret_cast<float4*>(&Bs[0][bk][bn]) = make_float4(rb[0], rb[1], rb[2], rb[3]);
    }
    __syncthreads();

    const int nk = (K + BK - 1) / BK;
    for (int t = 0; t < nk; ++t) {
        const int cur = t & 1;
        const bool more = t + 1 < nk;
        if (more) {
            const int k0 = (t + 1) * BK;
            ld4(A, M, K, m0 + ar, k0 + ak, vecK, ra);
            if (BT) ld4(B, N, K, n0 + ar, k0 + ak, vecK, rb);
            else    ld4(B, K, N, k0 + bk, n0 + bn, vecN, rb);
        }
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[cur][kk][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][kk][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][kk][64 + tx * 4]);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) {
            const int nxt = cur ^ 1;   // last read in iteration t-1, released by its barrier
#pragma unroll
            for (int i = 0; i < 4; ++i) As[nxt][ak + i][ar] = ra[i];
            if (BT) {
#pragma unroll
                for (int i = 0; i < 4; ++i) Bs[nxt][ak + i][ar] = rb[i];
            } else {
                *reinterpret_cast<float4*>(&Bs[nxt][bk][bn]) = make_float4(rb[0], rb[1], rb[2], rb[3]);
            }
        }
        __syncthreads();
    }
}
// ---- end of SGEMM core

__global__ void __launch_bounds__(256) gemm_swish_scale(const float* __restrict__ A, const float* __restrict__ W, const float* __restrict__ b, float* __restrict__ Y, int M, int N, int K) {
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    float acc[8][8];
    sgemm_block<false>(A, W, M, N, K, m0, n0, acc);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const bool vecN = (N & 3) == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int c = n0 + h * 64 + tx * 4;
        float bb[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) bb[j] = (c + j < N) ? __ldg(b + c + j) : 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int r = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
            if (r >= M) continue;
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float x = acc[i][h * 4 + j];
                const float z = x + bb[j];
                v[j] = 2.f * (z / (1.f + expf(-z)));
            }
            st4(Y, M, N, r, c, vecN, v);
        }
    }
}
