// Batched FFMA SGEMM Q @ K^T (K stored [S,D], transposed into shared memory; blockIdx.z = batch) with the 0.125 scale fused, writing scores into P; then an in-place row softmax.
// kevin: launch qk_scores grid=(cdiv(S,128), cdiv(S,128), B) block=(256) smem=0 args=(Q, K, P, S, S, D)
// kevin: launch row_softmax grid=(B*S) block=(256) smem=S*4 args=(P, S)

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

__global__ void __launch_bounds__(256) qk_scores(const float* __restrict__ A, const float* __restrict__ W, float* __restrict__ Y, int M, int N, int K) {
    const size_t bz = blockIdx.z;
    A += bz * (size_t)M * K;
    W += bz * (size_t)K * N;
    Y += bz * (size_t)M * N;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    float acc[8][8];
    sgemm_block<true>(A, W, M, N, K, m0, n0, acc);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const bool vecN = (N & 3) == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int c = n0 + h * 64 + tx * 4;

#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int r = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
            if (r >= M) continue;
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float x = acc[i][h * 4 + j];
                v[j] = x * 0.125f;
            }
            st4(Y, M, N, r, c, vecN, v);
        }
    }
}

#define NEG_INF __int_as_float(0xff800000)
// ---- block reductions (blockDim.x a multiple of 32, at most 1024)
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Every thread gets the block total. red: __shared__ float[32].
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();                 // red may still be read from a previous call
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : NEG_INF;
    return warp_max(v);
}

// ---- online log-sum-exp state (m = running max, s = sum of exp(x - m)); empty: (-inf, 0)
__device__ __forceinline__ void lse_push(float& m, float& s, float x) {
    if (x > m) { s = s * expf(m - x) + 1.f; m = x; }
    else       { s += expf(x - m); }
}
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == NEG_INF) return;
    s = (m == NEG_INF ? 0.f : s * expf(m - mn)) + (m2 == NEG_INF ? 0.f : s2 * expf(m2 - mn));
    m = mn;
}
// Every thread gets the block's (m, s). red: __shared__ float[64].
__device__ __forceinline__ void block_lse(float& m, float& s, float* red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    __syncthreads();
    if (lane == 0) { red[w] = m; red[32 + w] = s; }
    __syncthreads();
    m = lane < nw ? red[lane] : NEG_INF;
    s = lane < nw ? red[32 + lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
}

// Row softmax in place, one block per row; the row is cached in dynamic shared memory (N floats)
// while the online (max, sum of exp) pass runs, then normalised from shared memory.
__global__ void __launch_bounds__(256) row_softmax(float* Y, int N) {
    extern __shared__ float4 srow4[];
    float* srow = reinterpret_cast<float*>(srow4);
    __shared__ float red[64];
    float* y = Y + (size_t)blockIdx.x * N;
    const bool vec = (N & 3) == 0;
    float m = NEG_INF, s = 0.f;
    if (vec) {
        for (int q = threadIdx.x; q < N / 4; q += blockDim.x) {
            const float4 t = reinterpret_cast<const float4*>(y)[q];
            srow4[q] = t;
            lse_push(m, s, t.x); lse_push(m, s, t.y); lse_push(m, s, t.z); lse_push(m, s, t.w);
        }
    } else {
        for (int i = threadIdx.x; i < N; i += blockDim.x) {
            const float v = y[i];
            srow[i] = v;
            lse_push(m, s, v);
        }
    }
    block_lse(m, s, red);
    const float inv = 1.f / s;
    if (vec) {
        for (int q = threadIdx.x; q < N / 4; q += blockDim.x) {
            float4 t = srow4[q];
            t.x = expf(t.x - m) * inv; t.y = expf(t.y - m) * inv;
            t.z = expf(t.z - m) * inv; t.w = expf(t.w - m) * inv;
            reinterpret_cast<float4*>(y)[q] = t;
        }
    } else {
        for (int i = threadIdx.x; i < N; i += blockDim.x) y[i] = expf(srow[i] - m) * inv;
    }
}
