//! Validation against a task: kernels, dimensions, arguments, scratch, limits. Every error
//! message is asserted in full, since it is the feedback the policy sees.

use std::collections::BTreeMap;

use crate::candidate::{
    parse_response, validate, Dtype, Limits, ResolvedArg, ResolvedPlan, TaskSignature, TensorParam,
};

/// Kernels with the signatures the tests launch.
const KERNELS: &str = r#"
__global__ void axpy(const float* __restrict__ x, float* y, float alpha, int n) {}
__global__ void fill_half(__half* out, long long n) {}
__global__ void vec4(const float4* x, float* y, unsigned int n, size_t m, double d) {}
__global__ void takes_ref(const float& r) {}
template <int B> __global__ void templ(float* y) {}
__global__ void over(float* y) {}
__global__ void over(int* y) {}
__device__ float helper(float x) { return x; }
__global__ void decl_only(float* y);
__global__ void __launch_bounds__(256, 2) bounded(float* __restrict__ y, int n) {}
__global__ void no_params() {}
__global__ void void_params(void) {}
__global__ void half_scalar(__half h) {}
extern "C" __global__ void gather(const long long* idx, const __nv_bfloat16* src, void* out, int n) {}
"#;

/// Tensors x, y (f32), h (f16), idx (i64), all of N elements; sizes N = 1024, M = 3.
fn task() -> TaskSignature {
    let t = |name: &str, dtype, is_output| TensorParam {
        name: name.to_string(),
        dtype,
        elems: 1024,
        is_output,
    };
    TaskSignature {
        tensors: vec![
            t("x", Dtype::F32, false),
            t("y", Dtype::F32, true),
            t("h", Dtype::F16, false),
            t("idx", Dtype::I64, false),
        ],
        sizes: BTreeMap::from([("N".to_string(), 1024), ("M".to_string(), 3)]),
        eager_intermediate_bytes: 0,
    }
}

fn render(plan: &ResolvedPlan) -> String {
    let mut out: Vec<String> = plan
        .scratch
        .iter()
        .map(|s| format!("scratch {} {} x{}", s.name, s.dtype, s.elems))
        .collect();
    for l in &plan.launches {
        let args: Vec<String> = l
            .args
            .iter()
            .map(|a| match a {
                ResolvedArg::Tensor(i) => format!("t{i}"),
                ResolvedArg::Scratch(i) => format!("s{i}"),
                ResolvedArg::Scalar(s) => format!("{s:?}"),
            })
            .collect();
        out.push(format!(
            "{}@{} grid={:?} block={:?} smem={} args=[{}]",
            l.kernel,
            l.line,
            l.grid,
            l.block,
            l.smem_bytes,
            args.join(", ")
        ));
    }
    out.join("\n")
}

/// Validates `directives` (the top of the block) followed by [`KERNELS`] against [`task`].
fn check(directives: &str, expected: Result<&str, &str>) {
    let source = format!("{directives}\n{KERNELS}");
    check_source(&source, &task(), expected);
}

fn check_source(source: &str, sig: &TaskSignature, expected: Result<&str, &str>) {
    let candidate = parse_response(&super::response(source)).map_err(|e| e.to_string());
    let got =
        candidate.and_then(|c| validate(&c, sig, &Limits::default()).map_err(|e| e.to_string()));
    let got = got.map(|p| render(&p));
    assert_eq!(
        got,
        expected.map(str::to_string).map_err(str::to_string),
        "directives:\n{source}"
    );
}

/// Shorthand for an error on line 1 of a launch of `kernel`.
fn launch_err(kernel: &str, msg: &str) -> String {
    format!("line 1 of the cuda block (launch `{kernel}`): {msg}")
}

#[test]
fn the_gemm_fixture_resolves() {
    check_source(
        super::GEMM_SOURCE,
        &super::gemm_task(),
        Ok("scratch T f32 x2048\n\
            gemm_bias@3 grid=[2, 4, 1] block=[16, 16, 1] smem=0 args=[t0, t1, t2, s0, I32(64), I32(32), I32(16)]\n\
            relu_inplace@4 grid=[8, 1, 1] block=[256, 1, 1] smem=0 args=[s0, t3, I32(2048)]"),
    );
}

#[test]
fn scalars_take_their_parameter_type() {
    check(
        "// kevin: launch axpy grid=(cdiv(N,256)) block=(256) args=(x, y, 2, N)",
        Ok("axpy@1 grid=[4, 1, 1] block=[256, 1, 1] smem=0 args=[t0, t1, F32(2.0), I32(1024)]"),
    );
    check(
        "// kevin: launch vec4 grid=(1,2,3) block=(4,5,6) smem=N*4 args=(x, y, N/4, M, -0.5)",
        Ok("vec4@1 grid=[1, 2, 3] block=[4, 5, 6] smem=4096 args=[t0, t1, U32(256), U64(3), F64(-0.5)]"),
    );
    check(
        "// kevin: launch gather grid=1 block=1 args=(idx, x, h, N)",
        Err(&launch_err(
            "gather",
            "argument 2 `x` is a tensor of f32 elements but parameter 2 `const __nv_bfloat16* src` of `gather` points to bf16 elements",
        )),
    );
    check(
        "// kevin: launch fill_half grid=1 block=1 args=(h, N*N*N*N*N*N)",
        Ok("fill_half@1 grid=[1, 1, 1] block=[1, 1, 1] smem=0 args=[t2, I64(1152921504606846976)]"),
    );
}

#[test]
fn kernels_with_attributes_no_params_and_declarations() {
    check(
        "// kevin: launch bounded grid=1 block=256 args=(y, N)\n\
         // kevin: launch no_params grid=1 block=1 args=()\n\
         // kevin: launch void_params grid=1 block=1 args=()\n\
         // kevin: launch decl_only grid=1 block=1 args=(y)",
        Ok(
            "bounded@1 grid=[1, 1, 1] block=[256, 1, 1] smem=0 args=[t1, I32(1024)]\n\
            no_params@2 grid=[1, 1, 1] block=[1, 1, 1] smem=0 args=[]\n\
            void_params@3 grid=[1, 1, 1] block=[1, 1, 1] smem=0 args=[]\n\
            decl_only@4 grid=[1, 1, 1] block=[1, 1, 1] smem=0 args=[t1]",
        ),
    );
}

#[test]
fn argument_kind_mismatches() {
    let c = |args: &str, msg: &str| {
        check(
            &format!("// kevin: launch axpy grid=1 block=1 args=({args})"),
            Err(&launch_err("axpy", msg)),
        );
    };
    c(
        "x, y, x, N",
        "argument 3 `x` is a tensor but parameter 3 `float alpha` of `axpy` is a scalar (pass a size, an expression or a literal)",
    );
    c(
        "N, y, 2.0, N",
        "argument 1 `N` is a number but parameter 1 `const float* __restrict__ x` of `axpy` is a pointer (pass a tensor or a scratch buffer)",
    );
    c(
        "x + 1, y, 2.0, N",
        "argument 1 `x + 1` is a number but parameter 1 `const float* __restrict__ x` of `axpy` is a pointer (pass a tensor or a scratch buffer)",
    );
    c(
        "h, y, 2.0, N",
        "argument 1 `h` is a tensor of f16 elements but parameter 1 `const float* __restrict__ x` of `axpy` points to f32 elements",
    );
    c(
        "x, y, 2.0, 0.5",
        "argument 4 `0.5` is a float but parameter 4 `int n` of `axpy` is an integer",
    );
    c(
        "x, y, 2.0, 3000000000",
        "argument 4 `3000000000` is out of range for parameter 4 `int n` of `axpy` (int)",
    );
    c(
        "x, y, 2.0, N*N*N*N",
        "argument 4 `N * N * N * N` = 1099511627776 is out of range for parameter 4 `int n` of `axpy` (int)",
    );
    c(
        "x, y, 1e300, N",
        "argument 3 `1e300` is out of range for parameter 3 `float alpha` of `axpy` (float)",
    );
    c(
        "x, z, 2.0, N",
        "argument 2 `z` is not a tensor, scratch buffer or size of this task (tensors: x, y, h, idx; scratch: none; sizes: M, N)",
    );
    c(
        "x, y, 2.0, N + Q",
        "argument 4: `Q` is not a size of this task (sizes: M, N)",
    );
    c(
        "x, y, 2.0, N / (M - 3)",
        "argument 4: `N / (M - 3)` divides by zero",
    );
    c(
        "x, y",
        "`axpy` takes 4 parameters (const float* __restrict__ x, float* y, float alpha, int n) but the launch passes 2 arguments",
    );
    check(
        "// kevin: launch vec4 grid=1 block=1 args=(x, y, -1, N, 1)",
        Err(&launch_err(
            "vec4",
            "argument 3 `-1` is out of range for parameter 3 `unsigned int n` of `vec4` (unsigned int)",
        )),
    );
    check(
        "// kevin: launch takes_ref grid=1 block=1 args=(x)",
        Err(&launch_err(
            "takes_ref",
            "argument 1 `x` cannot be passed: parameter 1 `const float& r` of `takes_ref` has a type kevin cannot pass \
             (use a pointer, int, unsigned, long long, size_t, float or double)",
        )),
    );
    check(
        "// kevin: launch half_scalar grid=1 block=1 args=(1.0)",
        Err(&launch_err(
            "half_scalar",
            "argument 1 `1.0` cannot be passed: parameter 1 `__half h` of `half_scalar` has a type kevin cannot pass \
             (use a pointer, int, unsigned, long long, size_t, float or double)",
        )),
    );
}

#[test]
fn which_kernel() {
    let c = |kernel: &str, msg: &str| {
        check(
            &format!("// kevin: launch {kernel} grid=1 block=1 args=(y)"),
            Err(&launch_err(kernel, msg)),
        );
    };
    c(
        "axpyy",
        "no `__global__` kernel named `axpyy` in the cuda block (kernels: axpy, fill_half, vec4, takes_ref, templ, \
         over, decl_only, bounded, no_params, void_params, half_scalar, gather)",
    );
    c(
        "helper",
        "`helper` is not declared `__global__`; only `__global__` kernels can be launched",
    );
    c(
        "templ",
        "`templ` is a template; launched kernels must be plain `__global__` functions",
    );
    c(
        "over",
        "`over` is defined more than once; launched kernels must not be overloaded",
    );
    check_source(
        "// kevin: launch k grid=1 block=1 args=()\n#define K __global__ void k() {}\nK\n",
        &task(),
        Err(&launch_err(
            "k",
            "no `__global__` kernel named `k` in the cuda block (kernels: none)",
        )),
    );
}

#[test]
fn dimensions_and_shared_memory() {
    let c = |dims: &str, msg: &str| {
        check(
            &format!("// kevin: launch no_params {dims} args=()"),
            Err(&launch_err("no_params", msg)),
        );
    };
    c(
        "grid=0 block=1",
        "grid x = 0, but it must be between 1 and 2147483647",
    );
    c(
        "grid=(1, 65536) block=1",
        "grid y = 65536, but it must be between 1 and 65535",
    );
    c(
        "grid=(1, 1, N*64) block=1",
        "grid z = 65536 (`N * 64`), but it must be between 1 and 65535",
    );
    c(
        "grid=(N*N*N*2) block=1",
        "grid x = 2147483648 (`N * N * N * 2`), but it must be between 1 and 2147483647",
    );
    c(
        "grid=1 block=2048",
        "block x = 2048, but it must be between 1 and 1024",
    );
    c(
        "grid=1 block=(1,1,65)",
        "block z = 65, but it must be between 1 and 64",
    );
    c(
        "grid=1 block=(-N)",
        "block x = -1024 (`-N`), but it must be between 1 and 1024",
    );
    c(
        "grid=1 block=(32,32,2)",
        "block has 2048 threads; at most 1024 threads per block",
    );
    c(
        "grid=cdiv(N,0) block=1",
        "grid x: `cdiv(N, 0)` divides by zero",
    );
    c(
        "grid=(N*N*N*N*N*N*N) block=1",
        "grid x: `N * N * N * N * N * N * N` overflows 64-bit integer arithmetic",
    );
    c(
        "grid=x block=1",
        "grid x: `x` is a tensor, not a size; size expressions use only sizes (M, N) and integers",
    );
    c(
        "grid=1 block=1 smem=300000",
        "smem = 300000 bytes, but it must be between 0 and 232448",
    );
    c(
        "grid=1 block=1 smem=-M",
        "smem = -3 bytes (`-M`), but it must be between 0 and 232448",
    );
    check(
        "// kevin: launch no_params grid=(2147483647, 65535, 65535) block=(1, 1024) smem=232448 args=()",
        Ok("no_params@1 grid=[2147483647, 65535, 65535] block=[1, 1024, 1] smem=232448 args=[]"),
    );
}

#[test]
fn scratch_buffers() {
    check(
        "// kevin: scratch S f32[N]\n// kevin: scratch P i64[M]\n// kevin: launch axpy grid=1 block=1 args=(S, S, 1.0, N)",
        Ok("scratch S f32 x1024\nscratch P i64 x3\naxpy@3 grid=[1, 1, 1] block=[1, 1, 1] smem=0 args=[s0, s0, F32(1.0), I32(1024)]"),
    );
    let c = |directives: &str, msg: &str| {
        check(
            &format!("{directives}\n// kevin: launch no_params grid=1 block=1 args=()"),
            Err(msg),
        );
    };
    c(
        "// kevin: scratch S f32[N]\n// kevin: scratch S f32[N]",
        "line 2 of the cuda block (scratch `S`): scratch `S` is already declared on line 1",
    );
    c(
        "// kevin: scratch x f32[1]",
        "line 1 of the cuda block (scratch `x`): `x` is already a tensor of this task; choose another scratch name",
    );
    c(
        "// kevin: scratch N f32[1]",
        "line 1 of the cuda block (scratch `N`): `N` is already a size of this task; choose another scratch name",
    );
    c(
        "// kevin: scratch S f32[N-N]",
        "line 1 of the cuda block (scratch `S`): element count = 0 (`N - N`), but a scratch buffer needs at least 1 element",
    );
    c(
        "// kevin: scratch S f32[N]\n// kevin: scratch U f32[S]",
        "line 2 of the cuda block (scratch `U`): element count: `S` is a scratch buffer, not a size; size expressions \
         use only sizes (M, N) and integers",
    );
    c(
        "// kevin: scratch S f32[N*N*N]",
        "scratch buffers total 4294967296 bytes; the limit for this task is 1048576 bytes",
    );
    c(
        "// kevin: scratch S f32[N*N/4]\n// kevin: scratch U u8[1]",
        "scratch buffers total 1048577 bytes; the limit for this task is 1048576 bytes",
    );
    check(
        "// kevin: scratch S f16[N]\n// kevin: launch axpy grid=1 block=1 args=(S, y, 1.0, N)",
        Err("line 2 of the cuda block (launch `axpy`): argument 1 `S` is a scratch buffer of f16 elements but \
             parameter 1 `const float* __restrict__ x` of `axpy` points to f32 elements"),
    );
    check(
        "// kevin: scratch S f16[N]\n// kevin: launch axpy grid=1 block=1 args=(x, y, S, N)",
        Err("line 2 of the cuda block (launch `axpy`): argument 3 `S` is a scratch buffer but parameter 3 \
             `float alpha` of `axpy` is a scalar (pass a size, an expression or a literal)"),
    );
}

#[test]
fn scratch_cap_scales_with_the_task() {
    let limits = Limits::default();
    let mut sig = task();
    assert_eq!(limits.scratch_cap(&sig), 1 << 20);
    sig.tensors[0].elems = 1 << 20; // 4 MiB more
    assert_eq!(
        limits.scratch_cap(&sig),
        4 * ((1 << 22) + 4096 + 2048 + 8192)
    );
    sig.tensors[0].elems = u64::MAX;
    assert_eq!(limits.scratch_cap(&sig), 1 << 30);
    // Never below what PyTorch eager holds between the program's ops, past the 1 GiB cap too.
    sig.tensors[0].elems = 1024;
    sig.eager_intermediate_bytes = 5 << 30;
    assert_eq!(limits.scratch_cap(&sig), 5 << 30);
}

#[test]
fn plan_level_limits() {
    check_source(
        "__global__ void k() {}\n",
        &task(),
        Err("the cuda block declares no launches; add a line like `// kevin: launch KERNEL grid=(...) block=(...) args=(...)`"),
    );
    let many = "// kevin: launch no_params grid=1 block=1 args=()\n".repeat(17);
    check(
        &many,
        Err("the cuda block declares 17 launches; the limit is 16"),
    );
    let big = format!(
        "// {}\n// kevin: launch no_params grid=1 block=1 args=()",
        "x".repeat(70_000)
    );
    let len = big.len() + 1 + KERNELS.len();
    check(
        &big,
        Err(&format!(
            "the cuda block is {len} bytes; the limit is 65536 bytes"
        )),
    );
    check(
        "// kevin: launch no_params grid=1 block=1 args=()\n__device__ void f() { cudaDeviceSynchronize(); }",
        Err("line 2 of the cuda block: `cudaDeviceSynchronize` is host API; the block holds device code only (the \
             harness allocates memory, creates streams and launches kernels from the `// kevin:` lines)"),
    );
}

#[test]
fn resolved_plan_serde_round_trip() {
    let c = parse_response(&super::response(super::GEMM_SOURCE)).unwrap();
    let plan = validate(&c, &super::gemm_task(), &Limits::default()).unwrap();
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<ResolvedPlan>(&json).unwrap(), plan);
    assert!(json.contains(r#"{"scalar":{"i32":64}}"#), "{json}");
    let c2: crate::candidate::Candidate =
        serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(c2, c);
    let limits: Limits = serde_json::from_str(r#"{"max_launches": 4}"#).unwrap();
    assert_eq!(limits.max_launches, 4);
    assert!(serde_json::from_str::<Limits>(r#"{"max_lunches": 4}"#).is_err());
}

#[test]
fn long_name_lists_are_cut() {
    let kernels: String = (0..20)
        .map(|i| format!("__global__ void k{i}() {{}}\n__global__ void k{i}();\n"))
        .collect();
    let listed: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
    check_source(
        &format!("// kevin: launch nope grid=1 block=1 args=()\n{kernels}"),
        &task(),
        Err(&launch_err(
            "nope",
            &format!(
                "no `__global__` kernel named `nope` in the cuda block (kernels: {}, ...)",
                listed.join(", ")
            ),
        )),
    );
}

#[test]
fn quoted_source_stays_on_one_line() {
    // A parameter list spread over lines (and a parameter holding a raw string literal, which is
    // one token spanning lines) is quoted flat in the argument-count error.
    check_source(
        "// kevin: launch k grid=1 block=1 args=(A)\n\
         __global__ void k(const float* a,\n                  float* b) {}\n",
        &task(),
        Err(&launch_err(
            "k",
            "`k` takes 2 parameters (const float* a, float* b) but the launch passes 1 arguments",
        )),
    );
    let raw = format!("R\"x({})x\"", "word\n".repeat(100));
    let e = crate::candidate::rules::check(&format!("#{raw}\n__global__ void k() {{}}\n"))
        .unwrap_err()
        .1
        .to_string();
    assert!(
        !e.contains('\n') && e.contains("...") && e.len() < 300,
        "{e}"
    );
}
