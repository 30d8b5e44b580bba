// matmul_bf16: tensor-core GEMM (WMMA bf16 16x16x16, fp32 accumulate), 128x128x32 block tiles, 8 warps each
// 64x32, double-buffered padded shared tiles with 16-byte register-prefetched loads (guarded scalar path at
// edges or when K/N % 8 != 0), fp32 epilogue staged per fragment through shared memory, rounded to bf16.
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

#define TBM 128
#define TBN 128
#define TBK 32
#define LDA (TBK + 8)   // bf16 elements per shared A row (padding keeps ldmatrix-style reads conflict-light)
#define LDB (TBN + 8)
#define A_TILE (TBM * LDA)
#define B_TILE (TBK * LDB)

__global__ void __launch_bounds__(256) gemm_bf16_wmma(const __nv_bfloat16* __restrict__ A,
                                                      const __nv_bfloat16* __restrict__ B,
                                                      __nv_bfloat16* __restrict__ C, int M, int N, int K) {
    // 2 x (A tile + B tile) bf16 = 37,888 bytes; the epilogue reuses it (8 warps x 16x16 fp32 = 8 KiB).
    __shared__ __align__(128) __nv_bfloat16 smem[2 * (A_TILE + B_TILE)];
    __nv_bfloat16* As[2] = {smem, smem + A_TILE + B_TILE};
    __nv_bfloat16* Bs[2] = {smem + A_TILE, smem + 2 * A_TILE + B_TILE};

    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows wm*64..+63, cols wn*32..+31
    const int m0 = blockIdx.y * TBM, n0 = blockIdx.x * TBN;
    const bool kvec = (K & 7) == 0, nvec = (N & 7) == 0;

    uint4 ra[2], rb[2];
    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int idx = t + i * 256;
            // A: 128 rows x 32 k = 4 chunks of 8 per row
            {
                const int r = m0 + (idx >> 2), c = k0 + (idx & 3) * 8;
                if (kvec && r < M && c + 7 < K) {
                    ra[i] = __ldg(reinterpret_cast<const uint4*>(A + (long long)r * K + c));
                } else {
                    __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&ra[i]);
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        h[j] = (r < M && c + j < K) ? A[(long long)r * K + c + j] : __float2bfloat16(0.0f);
                }
            }
            // B: 32 k x 128 cols = 16 chunks of 8 per row
            {
                const int r = k0 + (idx >> 4), c = n0 + (idx & 15) * 8;
                if (nvec && r < K && c + 7 < N) {
                    rb[i] = __ldg(reinterpret_cast<const uint4*>(B + (long long)r * N + c));
                } else {
                    __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&rb[i]);
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        h[j] = (r < K && c + j < N) ? B[(long long)r * N + c + j] : __float2bfloat16(0.0f);
                }
            }
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int idx = t + i * 256;
            *reinterpret_cast<uint4*>(As[buf] + (idx >> 2) * LDA + (idx & 3) * 8) = ra[i];
            *reinterpret_cast<uint4*>(Bs[buf] + (idx >> 4) * LDB + (idx & 15) * 8) = rb[i];
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const int ktiles = (K + TBK - 1) / TBK;
    load(0);
    store(0);
    __syncthreads();
    int cur = 0;
    for (int kt = 0; kt < ktiles; ++kt) {
        const bool more = kt + 1 < ktiles;
        if (more) load((kt + 1) * TBK);
#pragma unroll
        for (int kk = 0; kk < TBK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb[2];
#pragma unroll
            for (int i = 0; i < 4; ++i) wmma::load_matrix_sync(fa[i], As[cur] + (wm * 64 + i * 16) * LDA + kk, LDA);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], Bs[cur] + kk * LDB + wn * 32 + j * 16, LDB);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        if (more) store(cur ^ 1);
        __syncthreads();
        cur ^= 1;
    }

    // Epilogue: each warp stages one 16x16 fp32 fragment at a time in its own 1 KiB of shared memory.
    float* stage = reinterpret_cast<float*>(smem) + warp * 256;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            const int r0 = m0 + wm * 64 + i * 16, c0 = n0 + wn * 32 + j * 16;
#pragma unroll
            for (int e = lane; e < 256; e += 32) {
                const int r = r0 + (e >> 4), c = c0 + (e & 15);
                if (r < M && c < N) C[(long long)r * N + c] = __float2bfloat16_rn(stage[e]);
            }
            __syncwarp();
        }
}
// kevin: launch gemm_bf16_wmma grid=(cdiv(N,128), cdiv(M,128)) block=(256) smem=0 args=(A, B, C, M, N, K)
