// matmul_bf16: tensor-core GEMM with inline PTX (cp.async 3-stage pipeline, ldmatrix, mma.sync m16n8k16 bf16 with
// fp32 accumulate), 128x128x32 block tiles, 8 warps each 64x32, XOR-swizzled shared tiles (conflict-free
// ldmatrix, 48 KiB static), zero-filled / scalar edge chunks when K or N % 8 != 0, bf16 rounding at the end.
// No <mma.h>: inline PTX needs no header beyond cuda_bf16.h.
#include <cuda_bf16.h>

#define TBM 128
#define TBN 128
#define TBK 32
#define STAGES 3
#define A_ELEMS (TBM * TBK)   // 4096 bf16: rows of 4 16-byte chunks, chunk c stored at c ^ ((row >> 1) & 3)
#define B_ELEMS (TBK * TBN)   // 4096 bf16: rows of 16 chunks, chunk c stored at c ^ (row & 7)
#define STAGE_ELEMS (A_ELEMS + B_ELEMS)

__device__ __forceinline__ int a_off(int row, int chunk) { return row * TBK + ((chunk ^ ((row >> 1) & 3)) << 3); }
__device__ __forceinline__ int b_off(int row, int chunk) { return row * TBN + ((chunk ^ (row & 7)) << 3); }

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::); }
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
    __shared__ __align__(128) __nv_bfloat16 smem[STAGES * STAGE_ELEMS];  // 49,152 bytes (static limit)
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows wm*64..+63, cols wn*32..+31
    const int m0 = blockIdx.y * TBM, n0 = blockIdx.x * TBN;
    const bool kvec = (K & 7) == 0, nvec = (N & 7) == 0;
    const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);

    // Loads one k-tile into a stage: 16-byte cp.async per chunk (zero-fill when the chunk is entirely outside),
    // element-wise guarded stores for chunks that straddle an edge or are misaligned.
    auto load_stage = [&](int stage, int k0) {
        __nv_bfloat16* as = smem + stage * STAGE_ELEMS;
        __nv_bfloat16* bs = as + A_ELEMS;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int idx = t + i * 256;
            {
                const int row = idx >> 2, chunk = idx & 3;
                const int r = m0 + row, c = k0 + chunk * 8;
                const int off = a_off(row, chunk);
                if (r < M && c + 7 < K && kvec) {
                    cp_async16(sbase + (stage * STAGE_ELEMS + off) * 2, A + (long long)r * K + c, 16);
                } else if (r >= M || c >= K) {
                    cp_async16(sbase + (stage * STAGE_ELEMS + off) * 2, A, 0);
                } else {
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        as[off + j] = c + j < K ? A[(long long)r * K + c + j] : __float2bfloat16(0.0f);
                }
            }
            {
                const int row = idx >> 4, chunk = idx & 15;
                const int r = k0 + row, c = n0 + chunk * 8;
                const int off = b_off(row, chunk);
                const unsigned dst = sbase + (stage * STAGE_ELEMS + A_ELEMS + off) * 2;
                if (r < K && c + 7 < N && nvec) {
                    cp_async16(dst, B + (long long)r * N + c, 16);
                } else if (r >= K || c >= N) {
                    cp_async16(dst, B, 0);
                } else {
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        bs[off + j] = c + j < N ? B[(long long)r * N + c + j] : __float2bfloat16(0.0f);
                }
            }
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int ktiles = (K + TBK - 1) / TBK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load_stage(s, s * TBK);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait_1();  // the group of tile kt has landed (one newer group may be in flight)
        __syncthreads();    // ... for every thread; and stage (kt - 1) % STAGES is free again
        if (kt + STAGES - 1 < ktiles) load_stage((kt + STAGES - 1) % STAGES, (kt + STAGES - 1) * TBK);
        cp_async_commit();
        const int stage = kt % STAGES;
        const unsigned as = sbase + stage * STAGE_ELEMS * 2;
        const unsigned bs = as + A_ELEMS * 2;
#pragma unroll
        for (int kk = 0; kk < TBK; kk += 16) {
            unsigned fa[4][4], fb[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = wm * 64 + i * 16 + (lane & 15), chunk = (kk >> 3) + (lane >> 4);
                ldsm_x4(as + a_off(row, chunk) * 2, fa[i][0], fa[i][1], fa[i][2], fa[i][3]);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int row = kk + (lane & 15), chunk = ((wn * 32 + j * 16) >> 3) + (lane >> 4);
                ldsm_x4_t(bs + b_off(row, chunk) * 2, fb[2 * j][0], fb[2 * j][1], fb[2 * j + 1][0], fb[2 * j + 1][1]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], fa[i], fb[j][0], fb[j][1]);
        }
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
