// matmul_bf16: tensor-core GEMM with inline PTX (ldmatrix + mma.sync m16n8k16 bf16, fp32 accumulate), 128x128x32
// block tiles, 8 warps each 64x32, double-buffered padded shared tiles (conflict-free ldmatrix) with 16-byte
// register-prefetched global loads (guarded scalar path at edges or when K/N % 8 != 0), bf16 rounding at the end.
// No <mma.h>: inline PTX needs no header beyond cuda_bf16.h.
#include <cuda_bf16.h>

#define TBM 128
#define TBN 128
#define TBK 32
#define LDA (TBK + 8)   // bf16 per shared A row: 80-byte stride, 8 ldmatrix rows hit distinct banks
#define LDB (TBN + 8)   // bf16 per shared B row: 272-byte stride
#define A_TILE (TBM * LDA)
#define B_TILE (TBK * LDB)

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(256) gemm_bf16_mma(const __nv_bfloat16* __restrict__ A,
                                                     const __nv_bfloat16* __restrict__ B,
                                                     __nv_bfloat16* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(128) __nv_bfloat16 smem[2 * (A_TILE + B_TILE)];  // 37,888 bytes
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows wm*64..+63, cols wn*32..+31
    const int m0 = blockIdx.y * TBM, n0 = blockIdx.x * TBN;
    const bool kvec = (K & 7) == 0, nvec = (N & 7) == 0;
    const __nv_bfloat16 zero = __float2bfloat16(0.0f);

    uint4 ra[2], rb[2];
    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int idx = t + i * 256;
            {   // A: 128 rows x 32 k, 4 chunks of 8 per row
                const int r = m0 + (idx >> 2), c = k0 + (idx & 3) * 8;
                if (kvec && r < M && c + 7 < K) {
                    ra[i] = __ldg(reinterpret_cast<const uint4*>(A + (long long)r * K + c));
                } else {
                    __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&ra[i]);
#pragma unroll
                    for (int j = 0; j < 8; ++j) h[j] = (r < M && c + j < K) ? A[(long long)r * K + c + j] : zero;
                }
            }
            {   // B: 32 k x 128 cols, 16 chunks of 8 per row
                const int r = k0 + (idx >> 4), c = n0 + (idx & 15) * 8;
                if (nvec && r < K && c + 7 < N) {
                    rb[i] = __ldg(reinterpret_cast<const uint4*>(B + (long long)r * N + c));
                } else {
                    __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&rb[i]);
#pragma unroll
                    for (int j = 0; j < 8; ++j) h[j] = (r < K && c + j < N) ? B[(long long)r * N + c + j] : zero;
                }
            }
        }
    };
    auto store = [&](int buf) {
        __nv_bfloat16* as = smem + buf * (A_TILE + B_TILE);
        __nv_bfloat16* bs = as + A_TILE;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int idx = t + i * 256;
            *reinterpret_cast<uint4*>(as + (idx >> 2) * LDA + (idx & 3) * 8) = ra[i];
            *reinterpret_cast<uint4*>(bs + (idx >> 4) * LDB + (idx & 15) * 8) = rb[i];
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const unsigned smem_base = (unsigned)__cvta_generic_to_shared(smem);
    const int ktiles = (K + TBK - 1) / TBK;
    load(0);
    store(0);
    __syncthreads();
    int cur = 0;
    for (int kt = 0; kt < ktiles; ++kt) {
        const bool more = kt + 1 < ktiles;
        if (more) load((kt + 1) * TBK);
        const unsigned as = smem_base + cur * (A_TILE + B_TILE) * 2;
        const unsigned bs = as + A_TILE * 2;
#pragma unroll
        for (int kk = 0; kk < TBK; kk += 16) {
            unsigned fa[4][4], fb[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = wm * 64 + i * 16 + (lane & 15), col = kk + (lane >> 4) * 8;
                ldsm_x4(as + (row * LDA + col) * 2, fa[i][0], fa[i][1], fa[i][2], fa[i][3]);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int row = kk + (lane & 15), col = wn * 32 + j * 16 + (lane >> 4) * 8;
                ldsm_x4_t(bs + (row * LDB + col) * 2, fb[2 * j][0], fb[2 * j][1], fb[2 * j + 1][0], fb[2 * j + 1][1]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], fa[i], fb[j][0], fb[j][1]);
        }
        if (more) store(cur ^ 1);
        __syncthreads();
        cur ^= 1;
    }

    const bool even = (N & 1) == 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = m0 + wm * 64 + i * 16 + (lane >> 2) + h * 8;
                const int c = n0 + wn * 32 + j * 8 + (lane & 3) * 2;
                if (r >= M) continue;
                __nv_bfloat16* dst = C + (long long)r * N + c;
                const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (even && c + 1 < N) {
                    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
                } else {
                    if (c < N) dst[0] = __float2bfloat16_rn(v0);
                    if (c + 1 < N) dst[1] = __float2bfloat16_rn(v1);
                }
            }
}
// kevin: launch gemm_bf16_mma grid=(cdiv(N,128), cdiv(M,128)) block=(256) smem=0 args=(A, B, C, M, N, K)
