//! Chat formatting: how a kevin prompt and a response become model text, in Qwen's ChatML.
//!
//! ```text
//! <|im_start|>system\n{system}<|im_end|>\n        (only when a system message is given)
//! <|im_start|>user\n{prompt}<|im_end|>\n
//! <|im_start|>assistant\n                         <- the generation prompt ends here
//! {response}<|im_end|>                            <- the completion; <|im_end|> is the EOS
//! ```
//!
//! Every kevin turn is one user message: later turns carry their history inside the prompt
//! ([`kevin::prompt::build`]), so a conversation never has more than one assistant message and
//! a multi-turn corpus example trains on its last turn alone.
//!
//! Token ids are the generation prompt's ids followed by the completion's ids, each encoded on
//! its own ([`encode_pair`]): that is exactly what the sampler sees (it encodes the prompt, then
//! appends the tokens it samples), so training and generation agree at the boundary. The
//! completion ends with `<|im_end|>`, the token the sampler stops on.

use crate::tokenizer::{Tokenizer, TokenizerError, IM_END, IM_START};

/// The text the model continues: optional system message, the user prompt, and the opened
/// assistant turn.
pub fn generation_prompt(system: Option<&str>, prompt: &str) -> String {
    let mut s = String::new();
    if let Some(sys) = system {
        s.push_str(&format!("{IM_START}system\n{sys}{IM_END}\n"));
    }
    s.push_str(&format!(
        "{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"
    ));
    s
}

/// The completion a model is trained to produce: the response and the end of the turn.
pub fn completion(response: &str) -> String {
    format!("{response}{IM_END}")
}

/// The whole training text: [`generation_prompt`] then [`completion`].
pub fn training_text(system: Option<&str>, prompt: &str, response: &str) -> String {
    generation_prompt(system, prompt) + &completion(response)
}

/// Token ids of a training example and where the completion starts: `(ids, prompt_len)`; the
/// loss covers `ids[prompt_len..]`.
pub fn encode_pair(
    tok: &Tokenizer,
    system: Option<&str>,
    prompt: &str,
    response: &str,
) -> Result<(Vec<u32>, usize), TokenizerError> {
    let mut ids = tok.encode(&generation_prompt(system, prompt))?;
    let prompt_len = ids.len();
    ids.extend(tok.encode(&completion(response))?);
    Ok((ids, prompt_len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::SPECIAL_TOKENS;

    #[test]
    fn chatml_layout() {
        assert_eq!(
            generation_prompt(None, "Write relu."),
            "<|im_start|>user\nWrite relu.<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            training_text(Some("You are kevin."), "P", "R"),
            "<|im_start|>system\nYou are kevin.<|im_end|>\n<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\nR<|im_end|>"
        );
    }

    #[test]
    fn completion_ends_with_the_eos_token() {
        let texts = ["__global__ void k() {}\n".repeat(50)];
        let tok = Tokenizer::train_bpe(texts.iter(), 400, &SPECIAL_TOKENS).unwrap();
        let (ids, prompt_len) =
            encode_pair(&tok, None, "Write relu.", "ok\n```cuda\nx\n```\ndone").unwrap();
        assert_eq!(ids.last().copied(), Some(tok.eos_ids()[0]));
        assert_eq!(
            tok.decode(&ids[..prompt_len]).unwrap(),
            generation_prompt(None, "Write relu.")
        );
        assert_eq!(
            tok.decode(&ids[prompt_len..]).unwrap(),
            completion("ok\n```cuda\nx\n```\ndone")
        );
        // The prompt's special tokens are single ids.
        let start = tok.token_id(IM_START).unwrap();
        assert_eq!(ids[0], start);
        assert_eq!(ids.iter().filter(|&&i| i == start).count(), 2);
    }
}
