//! Static rules, including comment and string false positives.

use crate::candidate::rules::check as check_rules;

/// `expected`: `None` if `source` passes, else `"line N: message"`.
fn check(source: &str, expected: Option<&str>) {
    let got = check_rules(source)
        .err()
        .map(|(line, v)| format!("line {line}: {v}"));
    assert_eq!(got.as_deref(), expected, "source:\n{source}");
}

fn host_api(line: usize, name: &str) -> String {
    format!(
        "line {line}: `{name}` is host API; the block holds device code only (the harness allocates \
         memory, creates streams and launches kernels from the `// kevin:` lines)"
    )
}

#[test]
fn device_code_passes() {
    check(super::GEMM_SOURCE, None);
    check(
        "#include <cuda_bf16.h>\n#include <cooperative_groups.h>\n#include <cooperative_groups/reduce.h>\n\
         #include <cuda/std/cstdint>\n#include <mma.h>\n#include <cuda_runtime.h>\n\
         #define TILE 32\n#ifndef X\n#define CDIV(a, b) (((a) + (b) - 1) / (b))\n#endif\n#pragma nounroll\n#\n\
         namespace cg = cooperative_groups;\n\
         __device__ float warp_sum(float v) { for (int o = 16; o; o >>= 1) v += __shfl_down_sync(~0u, v, o); return v; }\n\
         __global__ void k(float* y, cuda::std::int64_t n) { if (n > 1) y[0] = warp_sum(1.0f); }\n",
        None,
    );
}

#[test]
fn comments_and_strings_do_not_trip_rules() {
    check(
        "// cudaMalloc, main(), <<<grid, block>>>, std::vector, fopen(\"x\")\n\
         /* __host__ cudaDeviceSynchronize(); #include <stdio.h>\n #pragma omp */\n\
         __global__ void k() { printf(\"cudaMemcpy main() <<< std::thread exit(1) clock()\\n\"); }\n\
         __global__ void j() { const char c = '#'; }\n",
        None,
    );
}

#[test]
fn host_code() {
    check("int main() { return 0; }", Some("line 1: `main` is host code; write only device code and declare launches with `// kevin: launch` lines"));
    check(
        "\n\nvoid f() { k<<<1, 1>>>(); }",
        Some("line 3: `<<<...>>>` launches are host code; declare launches with `// kevin: launch` lines instead"),
    );
    check(
        "__host__ __device__ int f() { return 1; }",
        Some("line 1: `__host__` functions are not allowed; the block holds device code only"),
    );
    check(
        "void f() { float* p; cudaMalloc(&p, 4); }",
        Some(&host_api(1, "cudaMalloc")),
    );
    check("cudaStream_t s;", Some(&host_api(1, "cudaStream_t")));
    check(
        "void f() { cudaEventRecord(e); }",
        Some(&host_api(1, "cudaEventRecord")),
    );
    check(
        "void f() {\n cudaDeviceSynchronize(); }",
        Some(&host_api(2, "cudaDeviceSynchronize")),
    );
    check(
        "void f() { cuLaunchKernel(0); }",
        Some(&host_api(1, "cuLaunchKernel")),
    );
    check(
        "void f() { cublasSgemm(h); }",
        Some(&host_api(1, "cublasSgemm")),
    );
    check(
        "#define ALLOC cudaMalloc\n",
        Some(&host_api(1, "cudaMalloc")),
    );
}

#[test]
fn identifiers_that_only_look_banned_pass() {
    check(
        "__device__ int main_idx; __device__ float cuda_val; int domain(); int cudaish;",
        None,
    );
    check("__global__ void k(float* main) { main[0] = 1; }", None);
}

#[test]
fn standard_library() {
    check(
        "std::vector<float> v;",
        Some("line 1: `std::vector` is from the host C++ standard library; use plain arrays, CUDA intrinsics or `cuda::std::`"),
    );
    check(
        "void f() { ::std::thread t; }",
        Some("line 1: `std::thread` is from the host C++ standard library; use plain arrays, CUDA intrinsics or `cuda::std::`"),
    );
    check("cuda::std::array<float, 4> a;", None);
}

#[test]
fn system_calls() {
    let sys = |name: &str| {
        format!(
            "line 1: `{name}` (files, processes, the environment) is not allowed in device code"
        )
    };
    check(
        "void f() { FILE* f = fopen(\"/etc/passwd\", \"r\"); }",
        Some(&sys("fopen")),
    );
    check("void f() { system (\"rm -rf /\"); }", Some(&sys("system")));
    check("void f() { popen(\"ls\", \"r\"); }", Some(&sys("popen")));
    check("__device__ void f() { exit(1); }", Some(&sys("exit")));
    check(
        "__device__ void f() { getenv(\"HOME\"); }",
        Some(&sys("getenv")),
    );
    check(
        "__device__ int exit_code; __device__ int system_size;",
        None,
    );
}

#[test]
fn timers() {
    let timer = |line: usize, name: &str| {
        format!("line {line}: reading the GPU clock (`{name}`) is not allowed")
    };
    check(
        "__device__ long long t() { return clock64(); }",
        Some(&timer(1, "clock64")),
    );
    check(
        "__device__ long long t() { return clock(); }",
        Some(&timer(1, "clock")),
    );
    check(
        "__device__ unsigned long long t() {\n unsigned long long v;\n asm volatile(\"mov.u64 %0, %globaltimer;\" : \"=l\"(v));\n return v; }",
        Some(&timer(3, "%globaltimer")),
    );
    check(
        "__device__ void t() { unsigned v; asm(\"mov.u32 %0, %glob\" \"altimer_lo;\" : \"=r\"(v)); }",
        Some(&timer(1, "%globaltimer")),
    );
    check(
        "__device__ void t() { unsigned v; asm(\"mov.u32 %0, %clock;\" : \"=r\"(v)); }",
        Some(&timer(1, "%clock")),
    );
    check(
        "#define S(x) #x\n__device__ void t() { asm(S(mov.u64 %0, %globaltimer;)); }",
        Some(&timer(2, "globaltimer")),
    );
    // Inline PTX that reads no clock is fine.
    check(
        "__device__ void f(unsigned* d, const void* s) { asm volatile(\"cp.async.ca.shared.global [%0], [%1], 16;\" :: \"r\"(*d), \"l\"(s)); }",
        None,
    );
}

#[test]
fn includes() {
    let inc = |header: &str| {
        format!(
            "line 1: `#include {header}` is not allowed; allowed: <cuda_fp16.h>, <cuda_bf16.h>, <cuda_fp8.h>, \
             <cuda_runtime.h>, <mma.h>, <cooperative_groups.h>, <cuda_pipeline.h>, <math_constants.h>, \
             <cooperative_groups/...>, <cuda/...>"
        )
    };
    check("#include <stdio.h>", Some(&inc("<stdio.h>")));
    check("#include \"kernel.h\"", Some(&inc("\"kernel.h\"")));
    check("#include </etc/passwd>", Some(&inc("</etc/passwd>")));
    check(
        "#include <cuda/../../../etc/passwd>",
        Some(&inc("<cuda/../../../etc/passwd>")),
    );
    check("#include <cuda/>", Some(&inc("<cuda/>")));
    check(
        "#include <curand_kernel.h>",
        Some(&inc("<curand_kernel.h>")),
    );
    check("#include", Some(&inc("")));
    check("  #  include <cuda_fp16.h> // half\n", None);
    check("#include <cuda/pipeline>\n#include <cuda_pipeline.h>", None);
}

#[test]
fn pragmas_and_directives() {
    check(
        "#pragma unroll\n#pragma unroll 8\n#pragma unroll (4)\n",
        None,
    );
    check(
        "#pragma omp parallel for",
        Some("line 1: `#pragma omp parallel for` is not allowed; only `#pragma unroll` (with an optional count) and `#pragma nounroll`"),
    );
    check(
        "\n#pragma once",
        Some("line 2: `#pragma once` is not allowed; only `#pragma unroll` (with an optional count) and `#pragma nounroll`"),
    );
    check(
        "#error stop",
        Some("line 1: `#error` is not allowed; allowed: #include, #pragma unroll, #define, #undef, #if, #ifdef, #ifndef, #elif, #else, #endif"),
    );
    check(
        "#line 1 \"x\"",
        Some("line 1: `#line` is not allowed; allowed: #include, #pragma unroll, #define, #undef, #if, #ifdef, #ifndef, #elif, #else, #endif"),
    );
    check(
        "_Pragma(\"omp parallel\")",
        Some("line 1: `_Pragma` is not allowed; use `#pragma unroll`"),
    );
    check(
        "#define CAT(a, b) a##b\nCAT(cuda, Malloc)(0);",
        Some("line 1: token pasting (`##`) is not allowed"),
    );
    // A `#` that does not start a line is not a directive (stringification in a macro).
    check("#define STR(x) #x\n", None);
    // Continuation lines belong to the directive.
    check("#define F(x) \\\n  ((x) + 1)\n#pragma unroll\n", None);
}

#[test]
fn digraphs_count_as_hashes() {
    check(
        "%:include <stdio.h>",
        Some("line 1: `#include <stdio.h>` is not allowed; allowed: <cuda_fp16.h>, <cuda_bf16.h>, <cuda_fp8.h>, \
              <cuda_runtime.h>, <mma.h>, <cooperative_groups.h>, <cuda_pipeline.h>, <math_constants.h>, \
              <cooperative_groups/...>, <cuda/...>"),
    );
    check(
        "%:define CAT(a, b) a%:%:b",
        Some("line 1: token pasting (`##`) is not allowed"),
    );
    check(
        "%:include <cuda_fp16.h>\n__device__ int f(int a, int b) { return a %b; }",
        None,
    );
}

#[test]
fn line_splices_may_not_split_words() {
    let split = |line: usize| {
        format!("line {line}: a line continuation (`\\` at the end of a line) may not split a word; join the line")
    };
    check("void f() { cuda\\\nMalloc(0); }", Some(&split(1)));
    check("\nvoid f() { cuda\\\r\nMalloc(0); }", Some(&split(2)));
    check(
        "__device__ void t() { asm(\"mov.u64 %0, %glob\\\naltimer;\"); }",
        Some(&split(1)),
    );
    check(
        "__device__ void t() { asm(\"mov.u64 %0, %\\\nglobaltimer;\"); }",
        Some(&split(1)),
    );
    check(
        "__device__ void t() { asm(\"mov.u64 %0, \\\n%globaltimer;\"); }",
        Some("line 1: reading the GPU clock (`%globaltimer`) is not allowed"),
    );
    check(
        "#define F(x) foo(x)\\\n  + 1\n#define G(x) x \\\n  * 2\n",
        None,
    );
}

#[test]
fn universal_character_names_and_library_timers() {
    let backslash = "line 1: `\\` outside a string or character literal is not allowed (no universal character names in identifiers)";
    check("void f() { \\u0063udaMalloc(0); }", Some(backslash));
    check(
        "__device__ char c = '\\\\'; __device__ const char* s = \"\\u0063\";",
        None,
    );
    let timer = |name: &str| format!("line 1: reading the GPU clock (`{name}`) is not allowed");
    check(
        "__device__ auto t() { return cuda::ptx::get_sreg_globaltimer(); }",
        Some(&timer("get_sreg_globaltimer")),
    );
    check(
        "__device__ auto t() { return cuda::std::chrono::system_clock::now(); }",
        Some(&timer("chrono")),
    );
    check(
        "__device__ long long t() { return __clock64(); }",
        Some(&timer("__clock64")),
    );
    // A backslash, then spaces, then a newline is still a splice.
    check("#define F(x) x \\  \n  + 1\n", None);
}
