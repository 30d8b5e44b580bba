//! Unit tests of the CPU device model: each compiles a small kernel and checks one behaviour.
//! Skipped (with a message) when no C++ compiler is on PATH.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::candidate::{self, Candidate, Dtype, Limits, ResolvedPlan, TaskSignature, TensorParam};

/// A compiled test kernel with its plan.
struct Built {
    module: Module,
    plan: ResolvedPlan,
    _dir: TempDir,
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tensor(name: &str, dtype: Dtype, elems: u64, is_output: bool) -> TensorParam {
    TensorParam {
        name: name.into(),
        dtype,
        elems,
        is_output,
    }
}

fn plan_for(src: &str, tensors: Vec<TensorParam>) -> ResolvedPlan {
    let plan = candidate::plan::parse_plan(src).expect("plan");
    let cand = Candidate {
        source: src.into(),
        summary: String::new(),
        plan,
    };
    let sig = TaskSignature {
        tensors,
        sizes: BTreeMap::from([("N".to_string(), 4096)]),
        eager_intermediate_bytes: 0,
    };
    candidate::validate(&cand, &sig, &Limits::default()).expect("valid")
}

fn workdir(name: &str) -> TempDir {
    TempDir(std::env::temp_dir().join(format!("kevin-cpu-unit-{}-{name}", std::process::id())))
}

fn build(name: &str, src: &str, tensors: Vec<TensorParam>) -> Option<Built> {
    if let Err(e) = find_compiler() {
        eprintln!("SKIP {name}: {e}");
        return None;
    }
    let plan = plan_for(src, tensors);
    let dir = workdir(name);
    let so = match compile(src, &plan, &dir.0) {
        Ok(so) => so,
        Err(e) => panic!("{name}: {e}"),
    };
    let module = Module::load(&so).expect("load");
    Some(Built {
        module,
        plan,
        _dir: dir,
    })
}

/// Runs every launch of the plan on `threads` OS threads.
fn run(b: &Built, bufs: &[&HostBuffer], threads: usize) -> Result<(), LaunchFailure> {
    let ptrs: Vec<_> = bufs.iter().map(|b| b.as_ptr()).collect();
    for l in &b.plan.launches {
        // SAFETY: the buffers are as large as the test plans declare.
        unsafe { b.module.launch(l, &ptrs, &[], threads)? };
    }
    Ok(())
}

fn f32s(b: &HostBuffer) -> Vec<f64> {
    b.values(Dtype::F32)
}

#[test]
fn block_reduction_in_shared_memory() {
    let src = r#"
static __shared__ float s[256];
__global__ void reduce(const float* x, float* y, int n) {
    int t = threadIdx.x;
    float acc = 0.0f;
    for (int i = blockIdx.x * 256 + t; i < n; i += 256 * gridDim.x) acc += x[i];
    s[t] = acc;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (t < o) s[t] += s[t + o];
        __syncthreads();
    }
    if (t == 0) y[blockIdx.x] = s[0];
    int c = __syncthreads_count(t < 10);
    if (t == 1) y[gridDim.x + blockIdx.x] = (float)c;
}
// kevin: launch reduce grid=(8) block=(256) args=(X, Y, N)
"#;
    let Some(b) = build(
        "reduce",
        src,
        vec![
            tensor("X", Dtype::F32, 4096, false),
            tensor("Y", Dtype::F32, 16, true),
        ],
    ) else {
        return;
    };
    let x: Vec<f64> = (0..4096).map(|i| (i % 7) as f64).collect();
    let xb = HostBuffer::from_values(Dtype::F32, &x).expect("alloc");
    let yb = HostBuffer::zeroed(64).expect("alloc");
    run(&b, &[&xb, &yb], 2).expect("launch");
    let y = f32s(&yb);
    assert_eq!(y[..8].iter().sum::<f64>(), x.iter().sum::<f64>());
    assert!(y[8..].iter().all(|&c| c == 10.0), "{y:?}");
}

#[test]
fn warp_shuffles_and_votes() {
    let src = r#"
__global__ void warp(const float* x, float* y) {
    int t = threadIdx.x, lane = t & 31;
    float v = x[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    float d = x[t];
    for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
    float up = __shfl_up_sync(0xffffffffu, x[t], 1);
    double b = __shfl_sync(0xffffffffu, (double)x[t], 3);
    unsigned ballot = __ballot_sync(0xffffffffu, lane % 2 == 0);
    long long seg = __shfl_sync(0xffffffffu, (long long)lane, 0, 8);
    y[t * 6 + 0] = v;
    y[t * 6 + 1] = lane == 0 ? d : 0.0f;
    y[t * 6 + 2] = up;
    y[t * 6 + 3] = (float)b;
    y[t * 6 + 4] = ballot == 0x55555555u ? 1.0f : 0.0f;
    y[t * 6 + 5] = (float)seg;
}
// kevin: launch warp grid=(1) block=(64) args=(X, Y)
"#;
    let Some(b) = build(
        "warp",
        src,
        vec![
            tensor("X", Dtype::F32, 64, false),
            tensor("Y", Dtype::F32, 384, true),
        ],
    ) else {
        return;
    };
    let x: Vec<f64> = (0..64).map(|i| i as f64).collect();
    let xb = HostBuffer::from_values(Dtype::F32, &x).expect("alloc");
    let yb = HostBuffer::zeroed(384 * 4).expect("alloc");
    run(&b, &[&xb, &yb], 1).expect("launch");
    let y = f32s(&yb);
    for t in 0..64usize {
        let (w, lane) = (t / 32, t % 32);
        let warp_sum: f64 = (w * 32..w * 32 + 32).map(|i| i as f64).sum();
        let r = &y[t * 6..t * 6 + 6];
        assert_eq!(r[0], warp_sum, "xor sum, thread {t}");
        assert_eq!(
            r[1],
            if lane == 0 { warp_sum } else { 0.0 },
            "down sum, thread {t}"
        );
        assert_eq!(
            r[2],
            if lane == 0 { t as f64 } else { t as f64 - 1.0 },
            "up, thread {t}"
        );
        assert_eq!(r[3], (w * 32 + 3) as f64, "idx, thread {t}");
        assert_eq!(r[4], 1.0, "ballot, thread {t}");
        assert_eq!(r[5], (lane / 8 * 8) as f64, "width 8, thread {t}");
    }
}

#[test]
fn skipped_barrier_is_a_launch_error() {
    let src = r#"
__global__ void early(float* y) {
    if (threadIdx.x >= 16) return;
    __syncthreads();
    y[threadIdx.x] = 1.0f;
}
// kevin: launch early grid=(2) block=(32) args=(Y)
"#;
    let Some(b) = build("early", src, vec![tensor("Y", Dtype::F32, 32, true)]) else {
        return;
    };
    let yb = HostBuffer::zeroed(128).expect("alloc");
    let err = run(&b, &[&yb], 1).expect_err("must fail");
    assert!(
        matches!(&err, LaunchFailure::Launch(m) if m.contains("__syncthreads")),
        "{err}"
    );
}

#[test]
fn divergent_shuffle_is_unsupported() {
    let src = r#"
__global__ void div(float* y) {
    float v = threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    y[threadIdx.x] = v;
}
// kevin: launch div grid=(1) block=(32) args=(Y)
"#;
    let Some(b) = build("div", src, vec![tensor("Y", Dtype::F32, 32, true)]) else {
        return;
    };
    let yb = HostBuffer::zeroed(128).expect("alloc");
    let err = run(&b, &[&yb], 1).expect_err("must fail");
    assert_eq!(
        err,
        LaunchFailure::Unsupported("divergent warp in __shfl_xor_sync (block (0,0,0))".into())
    );
}

#[test]
fn dynamic_shared_memory() {
    let src = r#"
extern __shared__ float top[];
__global__ void rev(const float* x, float* y) {
    extern __shared__ __align__(16) float buf[];
    int t = threadIdx.x;
    buf[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    y[blockIdx.x * blockDim.x + t] = top[blockDim.x - 1 - t];
}
// kevin: launch rev grid=(4) block=(128) smem=512 args=(X, Y)
"#;
    let Some(b) = build(
        "dyn",
        src,
        vec![
            tensor("X", Dtype::F32, 512, false),
            tensor("Y", Dtype::F32, 512, true),
        ],
    ) else {
        return;
    };
    let x: Vec<f64> = (0..512).map(|i| i as f64).collect();
    let xb = HostBuffer::from_values(Dtype::F32, &x).expect("alloc");
    let yb = HostBuffer::zeroed(2048).expect("alloc");
    run(&b, &[&xb, &yb], 2).expect("launch");
    let y = f32s(&yb);
    for (i, &v) in y.iter().enumerate() {
        assert_eq!(v, ((i / 128) * 128 + 127 - i % 128) as f64);
    }
}

#[test]
fn atomics_across_blocks() {
    let src = r#"
__global__ void count(float* y, long long* c) {
    atomicAdd(y, 1.0f);
    atomicAdd(reinterpret_cast<unsigned long long*>(c), 1ull);
    atomicMax(reinterpret_cast<int*>(c + 1), (int)(blockIdx.x * blockDim.x + threadIdx.x));
}
// kevin: launch count grid=(64) block=(64) args=(Y, C)
"#;
    let Some(b) = build(
        "atomics",
        src,
        vec![
            tensor("Y", Dtype::F32, 1, true),
            tensor("C", Dtype::I64, 2, true),
        ],
    ) else {
        return;
    };
    let yb = HostBuffer::zeroed(4).expect("alloc");
    let cb = HostBuffer::zeroed(16).expect("alloc");
    run(&b, &[&yb, &cb], 4).expect("launch");
    assert_eq!(f32s(&yb), [4096.0]);
    assert_eq!(cb.values(Dtype::I64), [4096.0, 4095.0]);
}

#[test]
fn half_and_bf16_round_to_nearest_even() {
    let src = r#"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__global__ void conv(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[2 * i] = __half2float(__float2half_rn(x[i]));
    y[2 * i + 1] = __bfloat162float(__float2bfloat16(x[i]));
}
// kevin: launch conv grid=(cdiv(N,256)) block=(256) args=(X, Y, N)
"#;
    let Some(b) = build(
        "conv",
        src,
        vec![
            tensor("X", Dtype::F32, 4096, false),
            tensor("Y", Dtype::F32, 8192, true),
        ],
    ) else {
        return;
    };
    // Ties, subnormals, overflow, specials and a spread of ordinary values, all exact in f32.
    let mut x: Vec<f64> = vec![
        0.0,
        -0.0,
        1.0,
        65504.0,
        65520.0,
        65519.0,
        1e6,
        -1e6,
        6e-8,
        3e-8,
        2.9802322e-8,
    ];
    x.extend([
        f64::INFINITY,
        f64::NEG_INFINITY,
        1.0 + 2f64.powi(-11),
        1.0 + 3.0 * 2f64.powi(-11),
    ]);
    x.extend([
        1.0 + 2f64.powi(-8),
        1.0 + 3.0 * 2f64.powi(-8),
        2f64.powi(-14),
        2f64.powi(-24) * 1.5,
    ]);
    let mut s: u64 = 1;
    while x.len() < 4096 {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let bits = (s >> 32) as u32 & 0xbfff_ffff; // finite floats of all exponents below 2^64
        x.push(f32::from_bits(bits) as f64);
    }
    let x: Vec<f64> = x.into_iter().map(|v| v as f32 as f64).collect();
    let xb = HostBuffer::from_values(Dtype::F32, &x).expect("alloc");
    let yb = HostBuffer::zeroed(8192 * 4).expect("alloc");
    run(&b, &[&xb, &yb], 1).expect("launch");
    let y = f32s(&yb);
    use crate::ops::round::{round_bf16, round_f16};
    for (i, &v) in x.iter().enumerate() {
        let (h, bf) = (round_f16(v), round_bf16(v));
        assert!(
            y[2 * i] == h || (h.is_nan() && y[2 * i].is_nan()),
            "half({v}) = {}, want {h}",
            y[2 * i]
        );
        assert!(
            y[2 * i + 1] == bf || (bf.is_nan() && y[2 * i + 1].is_nan()),
            "bf16({v}) = {}, want {bf}",
            y[2 * i + 1]
        );
    }
}

#[test]
fn inline_asm_is_unsupported() {
    let src = "__global__ void k(float* y) { asm volatile(\"membar.gl;\"); y[0] = 1.0f; }\n\
               // kevin: launch k grid=(1) block=(1) args=(Y)\n";
    let plan = plan_for(src, vec![tensor("Y", Dtype::F32, 1, true)]);
    let dir = workdir("asm");
    let err = compile(src, &plan, &dir.0).expect_err("asm");
    assert_eq!(
        err,
        CpuCompileError::Unsupported {
            feature: "inline PTX: `membar.gl` (the CPU device model emulates only mma.sync \
                      m16n8k8/m16n8k16 with f16/bf16, ldmatrix m8n8 b16 and cp.async)"
                .into()
        }
    );
}

/// A small deterministic generator of test values.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// `{%a, %a+1, ...}`: `n` consecutive operands from `first`.
fn regs(first: usize, n: usize) -> String {
    let list: Vec<String> = (first..first + n).map(|i| format!("%{i}")).collect();
    format!("{{{}}}", list.join(", "))
}

/// One mma kernel `mma{v}`: the lanes build their A, B and C fragments from row-major matrices
/// by the PTX ISA's layouts, run the instruction, and store D by its layout (as f32).
fn mma_kernel(v: usize, k: usize, ab: &str, ct: &str, dt: &str) -> String {
    let (dn, an, bn, cn) = (
        if dt == "f32" { 4 } else { 2 },
        k / 4,
        k / 8,
        if ct == "f32" { 4 } else { 2 },
    );
    let (d_out, d_val) = if dt == "f32" {
        (
            "\"=f\"(d[0]), \"=f\"(d[1]), \"=f\"(d[2]), \"=f\"(d[3])",
            "d[i]",
        )
    } else {
        (
            "\"=r\"(dh[0]), \"=r\"(dh[1])",
            "__half2float(__ushort_as_half((unsigned short)(dh[i >> 1] >> (16 * (i & 1)))))",
        )
    };
    let mut ins: Vec<String> = (0..an).map(|i| format!("\"r\"(a[{i}])")).collect();
    ins.extend((0..bn).map(|i| format!("\"r\"(b[{i}])")));
    ins.extend((0..cn).map(|i| {
        if ct == "f32" {
            format!("\"f\"(c[{i}])")
        } else {
            format!("\"r\"(ch[{i}])")
        }
    }));
    let template = format!(
        "mma.sync.aligned.m16n8k{k}.row.col.{dt}.{ab}.{ab}.{ct} {}, {}, {}, {};",
        regs(0, dn),
        regs(dn, an),
        regs(dn + an, bn),
        regs(dn + an + bn, cn)
    );
    format!(
        r#"
__global__ void mma{v}(const unsigned short* A, const unsigned short* B, const float* C, float* D) {{
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    unsigned a[4], b[2], ch[2], dh[2];
    float c[4], d[4];
    for (int i = 0; i < {k} / 4; ++i) {{
        const int r = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
        a[i] = pk(A[r * 16 + col], A[r * 16 + col + 1]);
    }}
    for (int i = 0; i < {k} / 8; ++i) {{
        const int kk = 2 * t + 8 * i;
        b[i] = pk(B[kk * 8 + g], B[(kk + 1) * 8 + g]);
    }}
    for (int i = 0; i < 4; ++i) c[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    for (int i = 0; i < 2; ++i)
        ch[i] = pk(__half_as_ushort(__float2half_rn(c[2 * i])), __half_as_ushort(__float2half_rn(c[2 * i + 1])));
    asm volatile("{template}"
                 : {d_out}
                 : {ins});
    for (int i = 0; i < 4; ++i) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = {d_val};
}}
"#,
        ins = ins.join(", ")
    )
}

#[test]
fn mma_sync_matches_a_scalar_product() {
    // (K, A/B type, C type, D type); each kernel writes its own output D0..D4.
    let variants = [
        (16, "bf16", "f32", "f32"),
        (8, "bf16", "f32", "f32"),
        (16, "f16", "f16", "f32"),
        (8, "f16", "f32", "f16"),
        (16, "f16", "f16", "f16"),
    ];
    let mut src = String::from(
        "#include <cuda_fp16.h>\n__device__ unsigned pk(unsigned short lo, unsigned short hi) \
         { return (unsigned)lo | ((unsigned)hi << 16); }\n",
    );
    let mut tensors = vec![
        tensor("ABF", Dtype::Bf16, 256, false),
        tensor("BBF", Dtype::Bf16, 128, false),
        tensor("AH", Dtype::F16, 256, false),
        tensor("BH", Dtype::F16, 128, false),
        tensor("C", Dtype::F32, 128, false),
    ];
    for (v, &(k, ab, ct, dt)) in variants.iter().enumerate() {
        src.push_str(&mma_kernel(v, k, ab, ct, dt));
        let (a, b) = if ab == "bf16" {
            ("ABF", "BBF")
        } else {
            ("AH", "BH")
        };
        src.push_str(&format!(
            "// kevin: launch mma{v} grid=(1) block=(32) args=({a}, {b}, C, D{v})\n"
        ));
        tensors.push(tensor(&format!("D{v}"), Dtype::F32, 128, true));
    }
    let Some(b) = build("mma", &src, tensors) else {
        return;
    };
    // bf16: random values of every mantissa, so a sum rounded more than once would show;
    // f16 and C: multiples of 1/4 in [-2, 2], so that f16 accumulators are exact.
    let mut rng = Lcg(7);
    let mut random = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| crate::ops::round::round_bf16((rng.next() % 4001) as f64 / 1000.0 - 2.0))
            .collect()
    };
    let (abf, bbf) = (random(256), random(128));
    let mut quarters = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| (rng.next() % 17) as f64 / 4.0 - 2.0)
            .collect()
    };
    let (ah, bh, c) = (quarters(256), quarters(128), quarters(128));
    let bufs: Vec<HostBuffer> = vec![
        HostBuffer::from_values(Dtype::Bf16, &abf).expect("alloc"),
        HostBuffer::from_values(Dtype::Bf16, &bbf).expect("alloc"),
        HostBuffer::from_values(Dtype::F16, &ah).expect("alloc"),
        HostBuffer::from_values(Dtype::F16, &bh).expect("alloc"),
        HostBuffer::from_values(Dtype::F32, &c).expect("alloc"),
    ]
    .into_iter()
    .chain((0..variants.len()).map(|_| HostBuffer::zeroed(512).expect("alloc")))
    .collect();
    let refs: Vec<&HostBuffer> = bufs.iter().collect();
    run(&b, &refs, 1).expect("launch");
    use crate::ops::round::{round_f16, round_f32};
    for (v, &(k, ab, _, dt)) in variants.iter().enumerate() {
        let (a, bm) = if ab == "bf16" {
            (&abf, &bbf)
        } else {
            (&ah, &bh)
        };
        let got = f32s(&bufs[5 + v]);
        for r in 0..16 {
            for n in 0..8 {
                let exact =
                    c[r * 8 + n] + (0..k).map(|i| a[r * 16 + i] * bm[i * 8 + n]).sum::<f64>();
                let want = if dt == "f32" {
                    round_f32(exact)
                } else {
                    round_f16(round_f32(exact))
                };
                assert_eq!(
                    got[r * 8 + n],
                    want,
                    "variant {v} ({k} {ab} {dt}), D[{r}][{n}]"
                );
            }
        }
    }
}

#[test]
fn ldmatrix_gives_each_lane_its_fragment() {
    let src = r#"
__device__ void out(float* Y, int v, int lane, const unsigned* r, int n) {
    for (int i = 0; i < n; ++i) {
        Y[(v * 32 + lane) * 8 + 2 * i] = (float)(r[i] & 0xffffu);
        Y[(v * 32 + lane) * 8 + 2 * i + 1] = (float)(r[i] >> 16);
    }
}
__global__ void ldsm(float* Y) {
    __shared__ __align__(16) unsigned short tile[32 * 8];
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) tile[i] = (unsigned short)i;
    __syncwarp();
    const int row = (lane * 5 + 3) & 31;  // lane l names tile row (5l + 3) % 32
    const unsigned addr = (unsigned)__cvta_generic_to_shared(&tile[row * 8]);
    unsigned r[4];
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(addr));
    out(Y, 0, lane, r, 1);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
    out(Y, 1, lane, r, 2);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    out(Y, 2, lane, r, 4);
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(addr));
    out(Y, 3, lane, r, 1);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2+-16];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr + 16));
    out(Y, 4, lane, r, 2);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared::cta.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    out(Y, 5, lane, r, 4);
    // Generic addressing (no state space): a 64-bit pointer.
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(&tile[row * 8]));
    out(Y, 6, lane, r, 4);
}
// kevin: launch ldsm grid=(1) block=(32) args=(Y)
"#;
    let Some(b) = build("ldsm", src, vec![tensor("Y", Dtype::F32, 7 * 256, true)]) else {
        return;
    };
    let yb = HostBuffer::zeroed(7 * 256 * 4).expect("alloc");
    run(&b, &[&yb], 1).expect("launch");
    let y = f32s(&yb);
    let row = |lane: usize| (lane * 5 + 3) % 32;
    // (matrices, transposed) of each variant.
    let variants = [
        (1, false),
        (2, false),
        (4, false),
        (1, true),
        (2, true),
        (4, true),
        (4, false),
    ];
    for (v, &(n, trans)) in variants.iter().enumerate() {
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            for i in 0..4 {
                // Matrix i's row r is the tile row named by lane 8i + r; element (r, c) holds
                // that row's index * 8 + c.
                let elem = |r: usize, c: usize| (row(8 * i + r) * 8 + c) as f64;
                let want = match (i < n, trans) {
                    (false, _) => [0.0, 0.0],
                    (true, false) => [elem(g, 2 * t), elem(g, 2 * t + 1)],
                    (true, true) => [elem(2 * t, g), elem(2 * t + 1, g)],
                };
                let at = (v * 32 + lane) * 8 + 2 * i;
                assert_eq!(
                    [y[at], y[at + 1]],
                    want,
                    "variant {v} (x{n}, trans {trans}), lane {lane}, register {i}"
                );
            }
        }
    }
}

#[test]
fn cp_async_copies_and_zero_fills_static_and_dynamic_shared_memory() {
    let src = r#"
__global__ void cpa(const float* X, float* Y) {
    extern __shared__ __align__(16) float buf[];
    __shared__ __align__(16) float sarr[64];
    const int t = threadIdx.x;
    for (int e = 0; e < 4; ++e) buf[4 * t + e] = -1.0f;
    const unsigned dst = (unsigned)__cvta_generic_to_shared(buf + 4 * t);
    const int bytes = (t % 5) * 4;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(X + 4 * t), "r"(bytes) : "memory");
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n"
                 :: "r"((unsigned)__cvta_generic_to_shared(&sarr[t])), "l"(X + 256 + t) : "memory");
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    for (int e = 0; e < 4; ++e) Y[4 * t + e] = buf[4 * ((t + 1) & 63) + e];
    Y[256 + t] = sarr[63 - t];
    Y[320 + t] = __isShared(buf) && __isShared(&sarr[t]) && !__isShared(X) ? 1.0f : 0.0f;
    const float* back = (const float*)__cvta_shared_to_generic(__cvta_generic_to_shared(&sarr[t]));
    Y[384 + t] = back == &sarr[t] ? 1.0f : 0.0f;
}
// kevin: launch cpa grid=(2) block=(64) smem=1024 args=(X, Y)
"#;
    let Some(b) = build(
        "cpasync",
        src,
        vec![
            tensor("X", Dtype::F32, 320, false),
            tensor("Y", Dtype::F32, 448, true),
        ],
    ) else {
        return;
    };
    let x: Vec<f64> = (0..320).map(|i| i as f64 + 1.0).collect();
    let xb = HostBuffer::from_values(Dtype::F32, &x).expect("alloc");
    let yb = HostBuffer::zeroed(448 * 4).expect("alloc");
    // Two OS threads: each has its own TLS block, so its own static shared memory.
    run(&b, &[&xb, &yb], 2).expect("launch");
    let y = f32s(&yb);
    for t in 0..64 {
        let u = (t + 1) % 64;
        for e in 0..4 {
            let want = if e < u % 5 { x[4 * u + e] } else { 0.0 };
            assert_eq!(y[4 * t + e], want, "chunk of thread {u}, element {e}");
        }
        assert_eq!(y[256 + t], x[256 + 63 - t], "sarr[{}]", 63 - t);
        assert_eq!(y[320 + t], 1.0, "__isShared, thread {t}");
        assert_eq!(y[384 + t], 1.0, "address round trip, thread {t}");
    }
}

#[test]
fn ptx_faults_fail_the_launch() {
    let src = r#"
__global__ void misaligned(float* y) {
    extern __shared__ __align__(16) float buf[];
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(buf) + 4u), "l"(y));
}
__global__ void not_shared(float* y) { y[0] = (float)__cvta_generic_to_shared(y); }
__global__ void far(float* y) {
    __shared__ __align__(16) unsigned short tile[64];
    unsigned r;
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                 : "=r"(r) : "r"((unsigned)__cvta_generic_to_shared(tile) + (1u << 20)));
    y[0] = r;
}
__global__ void partial(float* y) {
    float d[4] = {0, 0, 0, 0};
    unsigned a = 0, b = 0;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%5,%5}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a), "r"(b));
    y[threadIdx.x] = d[0];
}
__global__ void diverge(float* y) {
    __shared__ __align__(16) unsigned short tile[64];
    unsigned r = 0;
    if (threadIdx.x < 16)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                     : "=r"(r) : "r"((unsigned)__cvta_generic_to_shared(tile)));
    y[threadIdx.x] = r;
}
// kevin: launch misaligned grid=(1) block=(32) smem=64 args=(Y)
// kevin: launch not_shared grid=(1) block=(1) args=(Y)
// kevin: launch far grid=(1) block=(32) args=(Y)
// kevin: launch partial grid=(1) block=(16) args=(Y)
// kevin: launch diverge grid=(1) block=(32) args=(Y)
"#;
    let Some(b) = build("ptxfaults", src, vec![tensor("Y", Dtype::F32, 32, true)]) else {
        return;
    };
    let yb = HostBuffer::zeroed(128).expect("alloc");
    let launch = |i: usize| {
        // SAFETY: Y has the 32 elements every kernel may write.
        unsafe { b.module.launch(&b.plan.launches[i], &[yb.as_ptr()], &[], 1) }
            .expect_err("must fail")
    };
    // A bad address is a fault that kills the context on a GPU: a device-side abort (a crash).
    let fault = |i: usize, says: &str| match launch(i) {
        LaunchFailure::Trap(m) if m.contains(says) => {}
        other => panic!("launch {i}: {other}, should be a fault saying {says:?}"),
    };
    fault(0, "cp.async.cg: misaligned address");
    fault(
        1,
        "__cvta_generic_to_shared of a pointer outside shared memory",
    );
    fault(2, "ldmatrix: shared address");
    assert_eq!(
        launch(3),
        LaunchFailure::Unsupported(
            "a warp of fewer than 32 threads in mma.sync (block (0,0,0))".into()
        )
    );
    assert_eq!(
        launch(4),
        LaunchFailure::Unsupported("divergent warp in ldmatrix (block (0,0,0))".into())
    );
}

#[test]
fn compile_errors_name_candidate_lines() {
    let src = "__global__ void k(float* y) {\n    y[0] = 1.0f;\n    y[1] = undefined_thing;\n}\n\
               // kevin: launch k grid=(1) block=(1) args=(Y)\n";
    if find_compiler().is_err() {
        return;
    }
    let plan = plan_for(src, vec![tensor("Y", Dtype::F32, 2, true)]);
    let dir = workdir("error");
    match compile(src, &plan, &dir.0) {
        Err(CpuCompileError::Source { log }) => {
            assert!(log.contains("candidate.cu:3"), "{log}");
            assert!(log.contains("undefined_thing"), "{log}");
            assert!(!log.contains(&dir.0.display().to_string()), "{log}");
        }
        other => panic!("expected a source error, got {other:?}"),
    }
}

#[test]
fn api_surface() {
    // Compiles a wide slice of CUDA's device API and checks a value from each group.
    let src = r#"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math_constants.h>
__device__ __forceinline__ float sq(float v) { return v * v; }
__global__ void __launch_bounds__(64, 2) api(const float* __restrict__ x, float* __restrict__ y, unsigned long long* u) {
    const int t = threadIdx.x;
    const float4 v4 = __ldg(reinterpret_cast<const float4*>(x) + (t & 3));
    float2 f2 = make_float2(v4.x, v4.y);
    double2 d2 = make_double2(1.0, 2.0);
    int2 i2 = make_int2(3, 4);
    uint4 u4 = make_uint4(1u, 2u, 3u, 4u);
    char4 c4 = make_char4(1, 2, 3, 4);
    float r = 0.0f;
    r += expf(0.0f) + __expf(0.0f) + exp2f(1.0f) + logf(1.0f) + __logf(1.0f) + log1pf(0.0f);
    r += sqrtf(4.0f) + rsqrtf(4.0f) + erff(0.0f) + erfcf(0.0f) + tanhf(0.0f) + powf(2.0f, 2.0f);
    r += fmaxf(1.0f, 2.0f) + fminf(1.0f, 2.0f) + fabsf(-1.0f) + fmaf(1.0f, 2.0f, 3.0f) + __fdividef(1.0f, 2.0f);
    r += __saturatef(2.0f) + floorf(1.5f) + ceilf(1.5f) + copysignf(1.0f, -2.0f) + __fmul_rn(2.0f, 3.0f);
    r += (isnan(CUDART_NAN_F) ? 1.0f : 0.0f) + (isinf(CUDART_INF_F) ? 1.0f : 0.0f) + sq(2.0f);
    r += min(1, 2) + max(1.0f, 2.0f) + max(3u, 4u) + min(2.0, 1.0);
    r += __popc(7u) + __clz(1) + __ffs(8) + (float)(__brev(1u) >> 31) + __int_as_float(__float_as_int(1.0f));
    r += f2.x * 0.0f + (float)d2.y + i2.x + u4.w + c4.z + blockDim.x * 0 + warpSize * 0;
    __half h = __float2half(1.5f);
    __half2 h2 = __floats2half2_rn(1.0f, 2.0f);
    h2 = __hadd2(h2, h2);
    float2 back = __half22float2(h2);
    __nv_bfloat16 b = __float2bfloat16(2.0f);
    __nv_bfloat162 b2 = __floats2bfloat162_rn(1.0f, 3.0f);
    r += __half2float(__hmul(h, h)) + back.y + __low2float(h2) + __high2float(b2) + __bfloat162float(b * b);
    r += __half2float(hexp(__float2half(0.0f))) + (float)(h + h) + (h > __float2half(1.0f) ? 1.0f : 0.0f);
    long long ll = __shfl_sync(0xffffffffu, (long long)t, 0);
    unsigned uu = __shfl_down_sync(0xffffffffu, (unsigned)t, 1);
    int any = __any_sync(__activemask(), t == 5), all = __all_sync(0xffffffffu, t < 64);
    __syncwarp();
    __threadfence();
    int band = __syncthreads_and(1), bor = __syncthreads_or(t == 0);
    atomicAdd(u, 1ull);
    atomicAdd(reinterpret_cast<double*>(u + 1), 0.5);
    atomicMin(reinterpret_cast<unsigned*>(u + 2), (unsigned)t + 5u);
    atomicExch(reinterpret_cast<float*>(u + 3), 7.0f);
    atomicCAS(reinterpret_cast<int*>(u + 4), 0, 9);
    atomicOr(reinterpret_cast<unsigned*>(u + 5), 1u << (t & 31));
    y[t] = r + (float)(ll + uu * 0) + any + all + band + bor;
}
// kevin: launch api grid=(1) block=(64) args=(X, Y, U)
"#;
    let tensors = vec![
        tensor("X", Dtype::F32, 16, false),
        tensor("Y", Dtype::F32, 64, true),
        tensor("U", Dtype::I64, 6, true),
    ];
    let Some(b) = build("api", src, tensors) else {
        return;
    };
    let xb = HostBuffer::from_values(Dtype::F32, &[1.0; 16]).expect("alloc");
    let yb = HostBuffer::zeroed(256).expect("alloc");
    let mut ub = HostBuffer::zeroed(48).expect("alloc");
    ub.bytes_mut()[16..20].copy_from_slice(&u32::MAX.to_ne_bytes());
    run(&b, &[&xb, &yb, &ub], 1).expect("launch");
    let y = f32s(&yb);
    // Sum of the constant terms above (thread-independent): checked once by hand.
    let expect = 2.0 + 2.0 + 0.0 + 0.0 + 0.0 // exp, __exp, exp2, log, __log, log1p
        + 2.0 + 0.5 + 0.0 + 1.0 + 0.0 + 4.0 // sqrt rsqrt erf erfc tanh pow
        + 2.0 + 1.0 + 1.0 + 5.0 + 0.5 // fmax fmin fabs fma fdivide
        + 1.0 + 1.0 + 2.0 - 1.0 + 6.0 // saturate floor ceil copysign fmul
        + 1.0 + 1.0 + 4.0 // isnan isinf sq
        + 1.0 + 2.0 + 4.0 + 1.0 // min max max min
        + 3.0 + 31.0 + 4.0 + 1.0 + 1.0 // popc clz ffs brev bitcast
        + 2.0 + 3.0 + 4.0 + 3.0 // d2.y i2.x u4.w c4.z
        + 2.25 + 4.0 + 2.0 + 3.0 + 4.0 // hmul, back.y, low2float, high2float, b*b
        + 1.0 + 3.0 + 1.0 // hexp h+h h>1
        + 1.0 + 1.0 + 1.0 + 1.0; // any all band bor
    for (t, &v) in y.iter().enumerate() {
        // ll is the warp's first thread index; `any` (t == 5) holds in warp 0 only.
        let warp = (t / 32) as f64;
        assert_eq!(v, expect + 32.0 * warp - warp, "thread {t}");
    }
    let u = ub.bytes();
    let word = |i: usize| u64::from_ne_bytes(u[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    assert_eq!(word(0), 64);
    assert_eq!(f64::from_bits(word(1)), 32.0);
    assert_eq!(word(2) as u32, 5);
    assert_eq!(f32::from_bits(word(3) as u32), 7.0);
    assert_eq!(word(4) as u32, 9);
    assert_eq!(word(5) as u32, u32::MAX);
}

#[test]
fn argument_count_and_kernel_name_are_checked() {
    let src = "__global__ void k(float* y, int n) { y[threadIdx.x] = n; }\n\
               // kevin: launch k grid=(1) block=(4) args=(Y, 3)\n";
    let Some(b) = build("nargs", src, vec![tensor("Y", Dtype::F32, 4, true)]) else {
        return;
    };
    let yb = HostBuffer::zeroed(16).expect("alloc");
    let mut short = b.plan.launches[0].clone();
    short.args.pop();
    // SAFETY: the launch is refused before any candidate code runs.
    let err = unsafe { b.module.launch(&short, &[yb.as_ptr()], &[], 1) }.expect_err("short");
    assert!(
        matches!(&err, LaunchFailure::Launch(m) if m.contains("takes 2 parameters")),
        "{err}"
    );
    let mut other = b.plan.launches[0].clone();
    other.kernel = "nope".into();
    // SAFETY: as above.
    let err = unsafe { b.module.launch(&other, &[yb.as_ptr()], &[], 1) }.expect_err("name");
    assert!(
        matches!(&err, LaunchFailure::Launch(m) if m.contains("no launcher")),
        "{err}"
    );
    run(&b, &[&yb], 1).expect("launch");
    assert_eq!(f32s(&yb), [3.0; 4]);
}

#[test]
fn shared_memory_starts_as_garbage_not_zeros() {
    // One thread reads its static and dynamic shared memory before anything wrote it: the model
    // fills both with 0xff bytes, NaN as a float and -1 as an integer.
    let src = r#"
__global__ void peek(float* y) {
    __shared__ float s[4];
    __shared__ int n[2];
    extern __shared__ float dyn[];
    y[0] = s[3];
    y[1] = (float)n[1];
    y[2] = dyn[7];
}
// kevin: launch peek grid=(1) block=(1) smem=64 args=(Y)
"#;
    let Some(b) = build("peek", src, vec![tensor("Y", Dtype::F32, 3, true)]) else {
        return;
    };
    for threads in [1, 2] {
        let yb = HostBuffer::zeroed(12).expect("alloc");
        run(&b, &[&yb], threads).expect("launch");
        let y = f32s(&yb);
        assert!(y[0].is_nan() && y[2].is_nan(), "{y:?}");
        assert_eq!(y[1], -1.0, "{y:?}");
    }
}

#[test]
fn trap_is_a_device_side_abort() {
    let src = r#"
__global__ void boom(float* y) {
    if (blockIdx.x == 1) __trap();
    y[blockIdx.x] = 1.0f;
}
// kevin: launch boom grid=(2) block=(1) args=(Y)
"#;
    let Some(b) = build("boom", src, vec![tensor("Y", Dtype::F32, 2, true)]) else {
        return;
    };
    let yb = HostBuffer::zeroed(8).expect("alloc");
    let err = run(&b, &[&yb], 1).expect_err("must fail");
    assert!(
        matches!(&err, LaunchFailure::Trap(m) if m.contains("__trap() called")),
        "{err}"
    );
}

/// The processes whose command line mentions `needle` (Linux /proc; empty elsewhere).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

#[test]
fn a_compile_past_its_deadline_leaves_no_compiler_behind() {
    if find_compiler().is_err() {
        return;
    }
    // Constant evaluation that keeps the compiler busy for minutes.
    let consts: String = (0..24)
        .map(|k| format!("constexpr unsigned long long C{k} = churn({k});\n"))
        .collect();
    let src = format!(
        "constexpr unsigned long long churn(unsigned long long s) {{\n\
         for (unsigned long long i = 0; i < 1000; ++i) for (unsigned long long j = 0; j < 1000; ++j) s = s * 3 + (i ^ j);\n\
         return s; }}\n{consts}\
         __global__ void k(float* y) {{ y[0] = (float)(C0 & 1); }}\n\
         // kevin: launch k grid=(1) block=(1) args=(Y)\n"
    );
    let plan = plan_for(&src, vec![tensor("Y", Dtype::F32, 1, true)]);
    let dir = workdir("bomb");
    let limit = std::time::Duration::from_millis(1500);
    let err = compile_with_deadline(&src, &plan, &dir.0, limit).expect_err("a bomb");
    assert_eq!(err, CpuCompileError::Timeout { limit });
    // The driver's children (cc1plus) die with it: killing only `g++` would orphan them.
    let needle = dir.0.display().to_string();
    let start = std::time::Instant::now();
    while !processes_mentioning(&needle).is_empty() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "still running: {:?}",
            processes_mentioning(&needle)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
