//! Extraction of the cuda block and the summary.

use crate::candidate::extract::extract;

/// `expected`: `Ok((source, summary))` or `Err(message)`.
fn check(response: &str, expected: Result<(&str, &str), &str>) {
    let got = extract(response)
        .map(|e| (e.source, e.summary))
        .map_err(|e| e.to_string());
    assert_eq!(
        got,
        expected.map_err(str::to_string),
        "response:\n{response}"
    );
}

#[test]
fn takes_the_block_and_the_summary() {
    check(
        "think\n```cuda\nint x;\n```\nIt adds.\n",
        Ok(("int x;\n", "It adds.")),
    );
}

#[test]
fn accepts_cu_and_cuh_in_any_case_with_extra_info() {
    check("```CU\na\n```\ns", Ok(("a\n", "s")));
    check("```cuh title=x\na\n```\ns", Ok(("a\n", "s")));
    check("  ```Cuda\na\n  ```\ns", Ok(("a\n", "s")));
}

#[test]
fn takes_the_last_cuda_block() {
    check(
        "```cuda\ndraft\n```\nmore\n```cuda\nfinal\n```\nsum",
        Ok(("final\n", "sum")),
    );
}

#[test]
fn summary_may_contain_other_blocks() {
    check(
        "```cuda\na\n```\nsum\n```text\nx\n```",
        Ok(("a\n", "sum\n```text\nx\n```")),
    );
}

#[test]
fn longer_fences_and_tildes() {
    check(
        "````cuda\n```\nstill code\n````\ns",
        Ok(("```\nstill code\n", "s")),
    );
    check("~~~cuda\na\n~~~\ns", Ok(("a\n", "s")));
    check("~~~cuda\na\n```\n~~~\ns", Ok(("a\n```\n", "s")));
}

#[test]
fn crlf_line_endings() {
    check("x\r\n```cuda\r\na\r\n```\r\nsum\r\n", Ok(("a\r\n", "sum")));
}

#[test]
fn cuda_fence_inside_another_block_is_text() {
    check(
        "```text\n```cuda\n```\n",
        Err("the response has no ```cuda block (found ```text instead); put all device code in one \
             ```cuda fenced block, followed by a one-paragraph summary"),
    );
}

#[test]
fn no_block_names_what_was_found() {
    check(
        "no code at all",
        Err(
            "the response has no ```cuda block; put all device code in one ```cuda fenced block, \
             followed by a one-paragraph summary",
        ),
    );
    check(
        "```cpp\na\n```\n```\nb\n```\ns",
        Err(
            "the response has no ```cuda block (found ```cpp, an unlabelled ``` instead); put all \
             device code in one ```cuda fenced block, followed by a one-paragraph summary",
        ),
    );
}

#[test]
fn inline_triple_backticks_are_not_fences() {
    check(
        "```cuda``` is the format",
        Err(
            "the response has no ```cuda block; put all device code in one ```cuda fenced block, \
             followed by a one-paragraph summary",
        ),
    );
}

#[test]
fn unclosed_block_is_an_error() {
    check(
        "a\nb\n```cuda\n__global__ void k() {",
        Err("the ```cuda block opened on line 3 of the response is never closed (end it with a line of ```)"),
    );
    // A shorter fence does not close a longer one.
    check(
        "````cuda\nx\n```\ns",
        Err("the ```cuda block opened on line 1 of the response is never closed (end it with a line of ```)"),
    );
}

#[test]
fn empty_block_and_missing_summary() {
    check("```cuda\n \n```\ns", Err("the ```cuda block is empty"));
    check(
        "```cuda\na\n```\n \n\n",
        Err(
            "there is no summary after the ```cuda block; end the response with one paragraph \
             summarising the kernel",
        ),
    );
}

#[test]
fn empty_and_odd_inputs() {
    check(
        "",
        Err(
            "the response has no ```cuda block; put all device code in one ```cuda fenced block, \
             followed by a one-paragraph summary",
        ),
    );
    check("```cuda\n```", Err("the ```cuda block is empty"));
    check("```cuda", Err("the ```cuda block opened on line 1 of the response is never closed (end it with a line of ```)"));
    check(
        "é```cuda\nx\n```\nß",
        Err(
            "the response has no ```cuda block (found an unlabelled ``` instead); put all device \
             code in one ```cuda fenced block, followed by a one-paragraph summary",
        ),
    );
    check("```cuda\né\n```\nß", Ok(("é\n", "ß")));
}
