use super::*;

fn feature(r: Result<Rewritten, CpuCompileError>) -> String {
    match r {
        Err(CpuCompileError::Unsupported { feature }) => feature,
        other => panic!("expected unsupported, got {other:?}"),
    }
}

fn log(r: Result<Rewritten, CpuCompileError>) -> String {
    match r {
        Err(CpuCompileError::Source { log }) => log,
        other => panic!("expected a source error, got {other:?}"),
    }
}

const MMA: &str = "__device__ void f(float* d, const unsigned* a, unsigned b0, unsigned b1) {\n\
    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, \"\n\
                 \"{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n\"\n\
                 : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n\
                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b0), \"r\"(b1));\n\
    }\n";

#[test]
fn mma_becomes_one_call_with_operands_bound_once() {
    let r = rewrite(MMA).expect("rewrites");
    assert!(r.collective);
    assert_eq!(r.source.lines().count(), MMA.lines().count());
    let s = &r.source;
    assert!(s.contains("auto& kevin_ptx_op0 = (d [ 0 ]);"), "{s}");
    assert!(s.contains("const auto kevin_ptx_op9 = (b1);"), "{s}");
    assert!(
        s.contains("::kevin::ptx_mma(16, ::kevin::PTX_BF16, ::kevin::PTX_F32, ::kevin::PTX_F32")
    );
    // C is read from the "+f" outputs, D written back to them.
    assert!(
        s.contains("kevin_ptx_c[4] = {::kevin::ptx_b32(kevin_ptx_op0),"),
        "{s}"
    );
    assert!(
        s.contains("::kevin::ptx_set(kevin_ptx_op3, kevin_ptx_d[3]);"),
        "{s}"
    );
    // The statement's line breaks follow it, before the `;`.
    assert!(s.contains("} while (0)\n\n\n;\n}"), "{s}");
    assert!(!s.contains("asm"), "{s}");
}

#[test]
fn cp_async_ldmatrix_and_groups_with_names_ties_and_clobbers() {
    let src = "__device__ void g(unsigned s, const void* p, int n, unsigned& r0, unsigned& r1) {\n\
        asm volatile(\"cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\" :: \"r\"(s), \"l\"(p), \"r\"(n) : \"memory\");\n\
        asm volatile(\"cp.async.commit_group;\\n\" ::);\n\
        asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(1));\n\
        asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.trans.shared::cta.b16 {%[a], %[b]}, [%[s]+16];\"\n\
                     : [a] \"=r\"(r0), [b] \"=r\"(r1) : [s] \"r\"(s));\n\
        asm(\"ldmatrix.sync.aligned.x4.trans.m8n8.shared.b16 {%0,%1,%2,%3}, [%4];\" : \"=r\"(r0), \"=r\"(r1), \"=r\"(r0), \"=r\"(r1) : \"l\"(p));\n\
        asm(\"cp.async.wait_all;\");\n\
        asm volatile(\"\" ::: \"memory\");\n\
        }\n";
    let r = rewrite(src).expect("rewrites");
    let s = &r.source;
    assert!(r.collective);
    assert_eq!(s.lines().count(), src.lines().count());
    assert!(s.contains("::kevin::ptx_cp_async(true, uint64_t(uint32_t(::kevin::ptx_b32(kevin_ptx_op0) + uint32_t(0ll))), (::kevin::ptx_b64(kevin_ptx_op1) + uint64_t(0ll)), uint64_t(16ll), uint64_t(::kevin::ptx_b32(kevin_ptx_op2)));"), "{s}");
    assert!(s.contains("::kevin::ptx_cp_async_commit_group();"), "{s}");
    assert!(s.contains("::kevin::ptx_cp_async_wait_group(::kevin::ptx_b64(kevin_ptx_op0));"));
    assert!(s.contains("::kevin::ptx_ldmatrix(2, true, true, uint64_t(uint32_t(::kevin::ptx_b32(kevin_ptx_op2) + uint32_t(16ll))), kevin_ptx_d); ::kevin::ptx_set(kevin_ptx_op0, kevin_ptx_d[0]); ::kevin::ptx_set(kevin_ptx_op1, kevin_ptx_d[1]);"), "{s}");
    assert!(s.contains("::kevin::ptx_ldmatrix(4, true, true, (::kevin::ptx_b64(kevin_ptx_op4) + uint64_t(0ll)), kevin_ptx_d);"), "{s}");
    assert!(s.contains("::kevin::ptx_cp_async_wait_all();"), "{s}");
    assert!(s.contains("do { } while (0);"), "{s}");

    // A matching constraint: the tied input is C, the output D.
    let tied = "__device__ void h(float& d, float c, unsigned a, unsigned b) {\n\
        asm(\"mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%0}, {%2}, {%3}, {%0};\" : \"=r\"(d) : \"0\"(c), \"r\"(a), \"r\"(b)); }\n";
    let r = rewrite(tied);
    assert!(
        log(r).contains("D must be a vector of 2 registers"),
        "f16 accumulators are two registers"
    );
    let tied = tied.replace("{%0}, {%2}, {%3}, {%0}", "{%0,%0}, {%2,%2}, {%3}, {%0,%0}");
    let s = rewrite(&tied).expect("tied").source;
    assert!(
        s.contains(
            "kevin_ptx_c[2] = {::kevin::ptx_b32(kevin_ptx_op1), ::kevin::ptx_b32(kevin_ptx_op1)}"
        ),
        "{s}"
    );
}

#[test]
fn asm_in_a_macro_keeps_its_line_splices() {
    let src = "#define COMMIT() asm volatile( \\\n  \"cp.async.commit_group;\" ::)\n__device__ void f() { COMMIT(); }\n";
    let s = rewrite(src).expect("rewrites").source;
    assert!(
        s.starts_with(
            "#define COMMIT() do { ::kevin::ptx_cp_async_commit_group(); } while (0) \\\n\n"
        ),
        "{s}"
    );
    assert_eq!(s.lines().count(), src.lines().count());
}

#[test]
fn unknown_instructions_and_syntax_are_unsupported_by_name() {
    let f = |body: &str| {
        feature(rewrite(&format!(
            "__device__ void f(unsigned& v, unsigned* p) {{ {body}; }}"
        )))
    };
    assert!(f("asm volatile(\"mov.u32 %0, %%laneid;\" : \"=r\"(v))")
        .starts_with("inline PTX: `mov.u32` (the CPU device model emulates only"));
    assert!(f("asm(\"membar.gl;\")").contains("`membar.gl`"));
    assert!(
        f("asm(\"{ .reg .pred p; setp.ne.b32 p, %0, 0; }\" :: \"r\"(v))").contains("scope block")
    );
    assert!(f("asm(\"@p cp.async.commit_group;\")").contains("predicated"));
    assert!(f("asm(\"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0}, {%0}, {%0}, {%0};\" : \"+r\"(v))").contains("m16n8k32"));
    assert!(f(
        "asm(\"cp.async.bulk.shared::cluster.global [%0], [%1], 16;\" :: \"r\"(v), \"l\"(p))"
    )
    .contains("cp.async.bulk"));
    assert!(f("asm(\"ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {%0}, [%1];\" : \"=r\"(v) : \"l\"(p))").contains("m16n16"));
    assert!(
        f("asm(\"ldmatrix.sync.aligned.m8n8.x2.x4.b16 {%0}, [%1];\" : \"=r\"(v) : \"l\"(p))")
            .contains("x2.x4")
    );
    assert!(f("asm(\"mov.u32 %0, 1;\" : \"=m\"(v))").contains("constraint \"=m\""));
    assert!(f("asm(\"cp.async.commit_group;\" ::: \"r1\")").contains("clobber \"r1\""));
    assert!(f("asm goto(\"bra %l0;\" :::: done)").contains("asm goto"));
    assert!(f("asm(TEMPLATE)").contains("not a string literal"));
    assert!(feature(rewrite("asm(\".globl x\");\n")).contains("file-scope asm"));
}

#[test]
fn recognised_instructions_written_wrongly_are_compile_errors() {
    let e = |body: &str| {
        log(rewrite(&format!(
            "__device__ void f(unsigned& v, unsigned s, const void* p) {{\n {body};\n}}"
        )))
    };
    let l = e(
        "asm(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %0}, [%1];\" : \"=r\"(v) : \"r\"(s))",
    );
    assert_eq!(l, "candidate.cu:2: error: inline PTX: `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: the destination must be a vector of 4 registers");
    assert!(
        e("asm(\"cp.async.ca.shared.global [%0], [%1];\" :: \"r\"(s), \"l\"(p))")
            .contains("takes 3 or 4 operands, found 2")
    );
    assert!(
        e("asm(\"cp.async.ca.shared.global [%0], [%1], 4;\" :: \"r\"(s), \"r\"(s))")
            .contains("an address needs \"l\"")
    );
    assert!(e("asm(\"cp.async.wait_group %1;\" :: \"n\"(1))").contains("operand %1 does not exist"));
    assert!(e("asm(\"cp.async.wait_group %[x];\" :: \"n\"(1))").contains("no operand named [x]"));
}
