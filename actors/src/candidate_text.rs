//! Interim: the response's ```cuda block and summary. Replaced by kevin::candidate when the
//! candidate parser lands.

/// The last ```cuda block and the paragraph after it, or what is wrong with the response.
pub fn extract(response: &str) -> Result<(String, Option<String>), String> {
    let start = response.rfind("```cuda").ok_or("the response has no ```cuda block")?;
    let body = &response[start + "```cuda".len()..];
    let end = body.find("```").ok_or("the ```cuda block is not closed")?;
    let source = body[..end].trim_matches('\n').to_string();
    let summary = body[end + 3..].trim();
    Ok((source, (!summary.is_empty()).then(|| summary.to_string())))
}
