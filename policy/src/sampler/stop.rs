//! Stop strings, found on the text of the generated tokens as it grows.
//!
//! Decoding every generated token again at every step would cost O(n) per step and O(n^2) per
//! response (4096 tokens x 64 sequences per step). [`StopScanner`] decodes incrementally, as
//! vLLM's detokenizer does: it decodes a short window before and after the newest tokens and
//! appends the difference, holding text back while it ends in U+FFFD (a character whose bytes
//! are split across tokens). A new stop string must end in the new text, so only the tail is
//! searched. The final text is decoded from all tokens once, when the sequence finishes, and cut
//! by [`cut_at_stop`]; the scanner only decides *when* to stop.

/// Incremental text of one sequence's generated tokens.
#[derive(Debug, Default)]
pub(crate) struct StopScanner {
    /// Text of `tokens[..read_offset]`.
    text: String,
    /// Start of the window re-decoded for context (so decoders that depend on the previous token
    /// produce the same text as a full decode).
    prefix_offset: usize,
    /// Tokens already turned into `text`.
    read_offset: usize,
}

impl StopScanner {
    /// Takes in `tokens` (all generated tokens so far, the newest last); true when one of `stops`
    /// now occurs in the text.
    pub(crate) fn push(
        &mut self,
        tokens: &[u32],
        stops: &[String],
        decode: &dyn Fn(&[u32]) -> String,
    ) -> bool {
        let prefix = decode(&tokens[self.prefix_offset..self.read_offset]);
        let window = decode(&tokens[self.prefix_offset..]);
        if window.ends_with('\u{FFFD}') {
            // The newest token ends inside a character: wait for the rest of its bytes.
            return false;
        }
        let old_len = self.text.len();
        match window.strip_prefix(prefix.as_str()) {
            Some(new) => self.text.push_str(new),
            // A decoder whose text of a window does not extend its text of the shorter window:
            // fall back to the full decode, and search all of it.
            None => {
                self.text = decode(tokens);
                self.prefix_offset = tokens.len();
                self.read_offset = tokens.len();
                return cut_at_stop(&self.text, stops).is_some();
            }
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = tokens.len();
        // A stop string not found before must end after `old_len`, so it starts at most
        // `len - 1` bytes before it.
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = old_len.saturating_sub(longest.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let tail = &self.text[from..];
        stops.iter().any(|s| tail.contains(s.as_str()))
    }
}

/// Byte offset of the earliest occurrence of any of `stops` in `text`.
pub(crate) fn cut_at_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops.iter().filter_map(|s| text.find(s.as_str())).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token t decodes to `pieces[t]`; a piece "\u{FFFD}" stands for a partial character,
    /// completed ("é") by the token that follows it.
    fn decoder(pieces: &'static [&'static str]) -> impl Fn(&[u32]) -> String {
        move |ids: &[u32]| {
            let mut s = String::new();
            for (i, &t) in ids.iter().enumerate() {
                let piece = pieces[t as usize];
                if piece == "\u{FFFD}" && i + 1 < ids.len() {
                    continue;
                }
                if piece == "\u{0301}" {
                    if i == 0 {
                        s.push('\u{FFFD}');
                    } else {
                        s.push('é');
                    }
                    continue;
                }
                s.push_str(piece);
            }
            s
        }
    }

    /// Pushes the tokens one at a time; the index of the token at which a stop fired.
    fn first_stop(
        pieces: &'static [&'static str],
        tokens: &[u32],
        stops: &[&str],
    ) -> Option<usize> {
        let decode = decoder(pieces);
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut scanner = StopScanner::default();
        (1..=tokens.len()).find(|&n| scanner.push(&tokens[..n], &stops, &decode))
    }

    const PIECES: &[&str] = &[
        "a", "b", "c", "``", "`", "\n", "\u{FFFD}", "\u{0301}", "xyz",
    ];

    #[test]
    fn stop_found_at_the_token_that_completes_it() {
        // "abc": stop "bc" completes at the third token.
        assert_eq!(first_stop(PIECES, &[0, 1, 2, 0], &["bc"]), Some(3));
        // "```" spans two tokens ("``" + "`").
        assert_eq!(first_stop(PIECES, &[0, 3, 4, 5], &["```"]), Some(3));
        // Inside one token.
        assert_eq!(first_stop(PIECES, &[0, 8, 0], &["y"]), Some(2));
        // Never.
        assert_eq!(first_stop(PIECES, &[0, 1, 0, 1], &["ba b"]), None);
        // The earliest of several.
        assert_eq!(first_stop(PIECES, &[0, 1, 2, 2], &["cc", "b"]), Some(2));
    }

    #[test]
    fn split_character_is_held_back_until_complete() {
        // "a" + (partial é) + (rest of é) + "b": "éb" is found once é is whole.
        assert_eq!(first_stop(PIECES, &[0, 6, 7, 1], &["éb"]), Some(4));
        assert_eq!(first_stop(PIECES, &[0, 6, 7], &["aé"]), Some(3));
    }

    #[test]
    fn cut_takes_the_earliest_stop() {
        let stops = vec!["b".to_string(), "ab".to_string(), "zz".to_string()];
        assert_eq!(cut_at_stop("xxabyb", &stops), Some(2));
        assert_eq!(cut_at_stop("xx", &stops), None);
    }
}
