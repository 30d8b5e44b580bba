// Fused bf16 GEMM on tensor cores (mma.sync m16n8k16 bf16 with fp32 accumulation via inline PTX, ldmatrix
// fragment loads; 128x128x32 block tile, 8 warps of 64x32, double-buffered shared memory with register
// prefetch) with bias + exact GELU applied to the accumulators before the bf16 store.
// kevin: launch gemm_bf16_bias_gelu grid=(cdiv(N,128), cdiv(M,128)) block=(256) smem=0 args=(A, W, b, Y, M, N, K)
#include <cuda_bf16.h>

#define TBM 128
#define TBN 128
#define TBK 32
#define LDA_S 40    // TBK + 8 bf16: 80-byte rows, 16-byte aligned, conflict-free ldmatrix
#define LDB_S 136   // TBN + 8 bf16: 272-byte rows

__device__ __forceinline__ unsigned pack2(unsigned short lo, unsigned short hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}

// 8 consecutive bf16 of row r, starting at column c, of a row-major [rows, cols] matrix; zero outside.
// vec: cols % 8 == 0 (then c % 8 == 0 and c < cols imply c + 7 < cols; 16-byte aligned).
__device__ __forceinline__ uint4 ld8(const __nv_bfloat16* __restrict__ P, int rows, int cols, int r, int c, bool vec) {
    if (r >= rows) return make_uint4(0u, 0u, 0u, 0u);
    const __nv_bfloat16* p = P + (size_t)r * cols + c;
    if (vec) return c < cols ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
    const unsigned short* u = reinterpret_cast<const unsigned short*>(p);
    unsigned short h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = (c + e < cols) ? u[e] : (unsigned short)0;
    return make_uint4(pack2(h[0], h[1]), pack2(h[2], h[3]), pack2(h[4], h[5]), pack2(h[6], h[7]));
}

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
// d += a (16x16 bf16, row) * b (16x8 bf16, col), fp32 accumulate
__device__ __forceinline__ void mma_bf16(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(256) gemm_bf16_bias_gelu(const __nv_bfloat16* __restrict__ A,
                                                           const __nv_bfloat16* __restrict__ W,
                                                           const __nv_bfloat16* __restrict__ b,
                                                           __nv_bfloat16* __restrict__ Y, int M, int N, int K) {
    __shared__ __align__(128) __nv_bfloat16 As[2][TBM][LDA_S];   // 20480 B
    __shared__ __align__(128) __nv_bfloat16 Bs[2][TBK][LDB_S];   // 17408 B

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;                     // warp tile: rows wm*64, cols wn*32
    const int m0 = blockIdx.y * TBM, n0 = blockIdx.x * TBN;
    const bool vecK = (K & 7) == 0, vecN = (N & 7) == 0;

    // loader coordinates: A tile 128x32 = 512 chunks of 8; B tile 32x128 = 512 chunks of 8
    int ar[2], ak[2], bk[2], bn[2];
#pragma unroll
    for (int it = 0; it < 2; ++it) {
        const int c = tid + it * 256;
        ar[it] = c >> 2;  ak[it] = (c & 3) * 8;
        bk[it] = c >> 4;  bn[it] = (c & 15) * 8;
    }

    float acc[4][4][4];   // [m16 fragment][n8 fragment][mma C registers]
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

    uint4 ra[2], rb[2];
#pragma unroll
    for (int it = 0; it < 2; ++it) {
        ra[it] = ld8(A, M, K, m0 + ar[it], ak[it], vecK);
        rb[it] = ld8(W, K, N, bk[it], n0 + bn[it], vecN);
    }
#pragma unroll
    for (int it = 0; it < 2; ++it) {
        *reinterpret_cast<uint4*>(&As[0][ar[it]][ak[it]]) = ra[it];
        *reinterpret_cast<uint4*>(&Bs[0][bk[it]][bn[it]]) = rb[it];
    }
    __syncthreads();

    // ldmatrix lane addressing: A x4 -> rows (lane & 15), k offset (lane >> 4) * 8;
    // B x4.trans -> k rows (lane & 15), n offset (lane >> 4) * 8 (two n8 fragments per load)
    const int lrow = lane & 15, lofs = (lane >> 4) * 8;
    const int nk = (K + TBK - 1) / TBK;
    for (int t = 0; t < nk; ++t) {
        const int cur = t & 1;
        const bool more = t + 1 < nk;
        if (more) {
            const int k0 = (t + 1) * TBK;
#pragma unroll
            for (int it = 0; it < 2; ++it) {
                ra[it] = ld8(A, M, K, m0 + ar[it], k0 + ak[it], vecK);
                rb[it] = ld8(W, K, N, k0 + bk[it], n0 + bn[it], vecN);
            }
        }
#pragma unroll
        for (int kk = 0; kk < TBK; kk += 16) {
            unsigned af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                ldsm_x4(smem_u32(&As[cur][wm * 64 + i * 16 + lrow][kk + lofs]), af[i][0], af[i][1], af[i][2], af[i][3]);
#pragma unroll
            for (int jj = 0; jj < 2; ++jj)
                ldsm_x4_trans(smem_u32(&Bs[cur][kk + lrow][wn * 32 + jj * 16 + lofs]),
                              bf[2 * jj][0], bf[2 * jj][1], bf[2 * jj + 1][0], bf[2 * jj + 1][1]);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
        if (more) {
            const int nxt = cur ^ 1;   // last read in iteration t-1, released by its barrier
#pragma unroll
            for (int it = 0; it < 2; ++it) {
                *reinterpret_cast<uint4*>(&As[nxt][ar[it]][ak[it]]) = ra[it];
                *reinterpret_cast<uint4*>(&Bs[nxt][bk[it]][bn[it]]) = rb[it];
            }
        }
        __syncthreads();
    }

    // Epilogue straight from the accumulators: C regs {0,1} -> row g, cols 2*tig, 2*tig+1; {2,3} -> row g+8
    const int g = lane >> 2, tig = lane & 3;
    const bool even = (N & 1) == 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int gc = n0 + wn * 32 + j * 8 + tig * 2;
        const float b0 = gc < N ? __bfloat162float(b[gc]) : 0.f;
        const float b1 = gc + 1 < N ? __bfloat162float(b[gc + 1]) : 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int gr = m0 + wm * 64 + i * 16 + g + h * 8;
                if (gr >= M || gc >= N) continue;
                const float v0 = gelu_erf(acc[i][j][2 * h] + b0);
                const float v1 = gelu_erf(acc[i][j][2 * h + 1] + b1);
                __nv_bfloat16* y = Y + (size_t)gr * N + gc;
                if (even) {
                    *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(v0, v1);
                } else {
                    y[0] = __float2bfloat16_rn(v0);
                    if (gc + 1 < N) y[1] = __float2bfloat16_rn(v1);
                }
            }
        }
    }
}
