//! The policy's tokenizer: a thin wrapper over Hugging Face `tokenizers` that reads and writes
//! `tokenizer.json`, and trains a small byte-level BPE for kevin's own models.
//!
//! Byte-level BPE, as GPT-2 and Qwen2 use it: the pre-tokenizer maps every byte to a printable
//! character and splits with the GPT-2 regex, the decoder maps them back, and the trainer starts
//! from all 256 byte characters, so any byte sequence encodes and decodes back exactly: a policy
//! can write any CUDA it likes. No prefix space is added (Qwen2's setting), so `decode(encode(s))
//! == s` for every string `s`. Special tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, as
//! Qwen uses them) are matched whole in the text and never split.
//!
//! The end-of-sequence tokens ([`Tokenizer::eos_ids`]) are `<|im_end|>` (the end of an assistant
//! turn: what the sampler stops on) and `<|endoftext|>`, whichever the vocabulary has.
//! [`crate::chat`] formats conversations with them.

use std::path::{Path, PathBuf};

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::byte_level::ByteLevel as ByteLevelProcessor;
use tokenizers::{AddedToken, TokenizerBuilder};

/// Qwen's end of a document.
pub const ENDOFTEXT: &str = "<|endoftext|>";
/// Qwen's start of a chat turn (followed by the role and a newline).
pub const IM_START: &str = "<|im_start|>";
/// Qwen's end of a chat turn: the sampler's stop token.
pub const IM_END: &str = "<|im_end|>";
/// The special tokens a trained tokenizer gets by default, in id order (0, 1, 2).
pub const SPECIAL_TOKENS: [&str; 3] = [ENDOFTEXT, IM_START, IM_END];

/// Why a tokenizer could not be loaded, saved, trained or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.json` could not be read or parsed.
    #[error("tokenizer file {path}: {reason}")]
    Load {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// `tokenizer.json` could not be written.
    #[error("writing tokenizer file {path}: {reason}")]
    Save {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// BPE training failed.
    #[error("training a BPE tokenizer of {vocab_size} tokens: {reason}")]
    Train {
        /// The requested vocabulary size.
        vocab_size: usize,
        /// What failed.
        reason: String,
    },
    /// The vocabulary size cannot hold the byte alphabet and the special tokens.
    #[error("vocab size {vocab_size} is too small: byte-level BPE needs at least {min} (256 bytes + {specials} special tokens)")]
    VocabTooSmall {
        /// The requested size.
        vocab_size: usize,
        /// The smallest possible size.
        min: usize,
        /// Number of special tokens.
        specials: usize,
    },
    /// Encoding failed (e.g. the pre-tokenizer's regex gave up on a pathological input).
    #[error("encoding {chars} characters: {reason}")]
    Encode {
        /// Length of the input.
        chars: usize,
        /// What failed.
        reason: String,
    },
    /// Decoding failed (e.g. an id outside the vocabulary).
    #[error("decoding {tokens} tokens: {reason}")]
    Decode {
        /// Number of ids.
        tokens: usize,
        /// What failed.
        reason: String,
    },
}

/// A loaded or trained tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos: Vec<u32>,
    /// The number of ids, added tokens included, counted once: `tokenizers` builds its whole
    /// vocabulary map to count it, and `decode` checks every id against it (counting per id made
    /// decoding a 1024-token response take 0.2-0.4 s, most of the RL loop's generation time).
    vocab: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tokenizer({} tokens, eos {:?})",
            self.vocab_size(),
            self.eos
        )
    }
}

impl Tokenizer {
    fn new(inner: tokenizers::Tokenizer) -> Tokenizer {
        let eos = [IM_END, ENDOFTEXT]
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .collect();
        let vocab = inner.get_vocab_size(true);
        Tokenizer { inner, eos, vocab }
    }

    /// Loads a Hugging Face `tokenizer.json` (kevin's own, or an open-weight model's).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Load {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(Tokenizer::new(inner))
    }

    /// Writes `tokenizer.json` (pretty-printed), readable by `tokenizers` and `transformers`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), TokenizerError> {
        let path = path.as_ref();
        self.inner
            .save(path, true)
            .map_err(|e| TokenizerError::Save {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
    }

    /// Trains a byte-level BPE of `vocab_size` tokens (special tokens included) on `texts`.
    /// `specials` get the first ids, in order (usually [`SPECIAL_TOKENS`]).
    pub fn train_bpe<I, S>(
        texts: I,
        vocab_size: usize,
        specials: &[&str],
    ) -> Result<Tokenizer, TokenizerError>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
    {
        let alphabet: std::collections::HashSet<char> = ByteLevel::alphabet().into_iter().collect();
        let min = alphabet.len() + specials.len();
        if vocab_size < min {
            return Err(TokenizerError::VocabTooSmall {
                vocab_size,
                min,
                specials: specials.len(),
            });
        }
        let train_err = |e: tokenizers::Error| TokenizerError::Train {
            vocab_size,
            reason: e.to_string(),
        };
        let mut trainer = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(vocab_size)
            .min_frequency(2)
            // Every byte is in the vocabulary whether or not the texts contain it.
            .initial_alphabet(alphabet)
            .special_tokens(
                specials
                    .iter()
                    .map(|s| AddedToken::from(s.to_string(), true))
                    .collect(),
            )
            .build();
        // Qwen2's byte-level settings: no prefix space, offsets untrimmed, the GPT-2 split regex.
        let mut tokenizer = TokenizerBuilder::<
            BPE,
            NormalizerWrapper,
            ByteLevel,
            ByteLevelProcessor,
            ByteLevelDecoder,
        >::new()
        .with_model(BPE::default())
        .with_normalizer(None)
        .with_pre_tokenizer(Some(ByteLevel::new(false, false, true)))
        .with_post_processor(Some(ByteLevelProcessor::new(false, false, true)))
        .with_decoder(Some(ByteLevelDecoder::default()))
        .build()
        .map_err(train_err)?;
        tokenizer.train(&mut trainer, texts).map_err(train_err)?;
        Ok(Tokenizer::new(tokenizers::Tokenizer::from(tokenizer)))
    }

    /// The ids of `text`. Special tokens written in the text become their ids; nothing is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode {
                chars: text.chars().count(),
                reason: e.to_string(),
            })
    }

    /// The text of `ids`, special tokens included: `decode(encode(s)) == s`.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let vocab = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(TokenizerError::Decode {
                tokens: ids.len(),
                reason: format!("id {bad} is outside the vocabulary of {}", vocab),
            });
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Decode {
                tokens: ids.len(),
                reason: e.to_string(),
            })
    }

    /// The end-of-sequence ids: `<|im_end|>` first, then `<|endoftext|>`, those present.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The id of a token (special or not), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The number of ids, added tokens included (the model's embedding needs at least this).
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few kernels and prompts in the real format, repeated so that merges have something to
    /// learn, plus the reference solutions when the repository is here.
    fn training_texts() -> Vec<String> {
        let mut texts = Vec::new();
        let solutions = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tasks/solutions");
        if let Ok(dir) = std::fs::read_dir(&solutions) {
            let mut files: Vec<_> = dir.flatten().map(|e| e.path()).collect();
            files.sort();
            for f in files {
                texts.push(std::fs::read_to_string(f).unwrap());
            }
        }
        texts.push(
            "__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, int n) {\n    \
             int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) Y[i] = fmaxf(X[i], 0.0f);\n}\n"
                .repeat(20),
        );
        texts
    }

    fn trained() -> Tokenizer {
        Tokenizer::train_bpe(training_texts().into_iter(), 1024, &SPECIAL_TOKENS).unwrap()
    }

    const SAMPLES: [&str; 7] = [
        "",
        "__global__ void k(float* y) { y[threadIdx.x] = 0.0f; }\n// kevin: launch k grid=(cdiv(N,256)) block=(256) args=(Y)",
        "  leading spaces, trailing spaces   \n\n\ttabs\r\nCRLF",
        "unicode: héllo wörld, 日本語, emoji 🚀, math ∑ x² ≤ ∞",
        "<|im_start|>user\nWrite relu.<|im_end|>\n<|im_start|>assistant\n",
        "a<|im_end|>b<|endoftext|><|im_start|>",
        "#include <cuda_fp16.h>\n    __half h = __float2half(1.5f); /* comment */ \"string\" 'c' 0x1fULL 1e-5f",
    ];

    #[test]
    fn round_trips_arbitrary_text_exactly() {
        let tok = trained();
        for s in SAMPLES {
            let ids = tok.encode(s).unwrap();
            assert_eq!(tok.decode(&ids).unwrap(), s, "{s:?} -> {ids:?}");
        }
        // Every single byte value that forms valid UTF-8 on its own, and a long random mix.
        let all: String = (0u32..0x800).filter_map(char::from_u32).collect();
        assert_eq!(tok.decode(&tok.encode(&all).unwrap()).unwrap(), all);
    }

    #[test]
    fn special_tokens_are_whole_and_eos_is_im_end() {
        let tok = trained();
        for (i, s) in SPECIAL_TOKENS.iter().enumerate() {
            assert_eq!(tok.token_id(s), Some(i as u32), "{s}");
            assert_eq!(
                tok.encode(s).unwrap(),
                vec![i as u32],
                "{s} encodes as one token"
            );
        }
        assert_eq!(tok.eos_ids(), &[2, 0]);
        assert_eq!(tok.vocab_size(), 1024);
        assert!(matches!(
            Tokenizer::train_bpe(["x"].into_iter(), 100, &SPECIAL_TOKENS),
            Err(TokenizerError::VocabTooSmall { min: 259, .. })
        ));
        assert!(matches!(
            tok.decode(&[5000]),
            Err(TokenizerError::Decode { .. })
        ));
    }

    #[test]
    fn compresses_cuda_code() {
        let tok = trained();
        let text = training_texts().join("\n");
        let ids = tok.encode(&text).unwrap();
        let bytes_per_token = text.len() as f64 / ids.len() as f64;
        println!(
            "bytes per token on {} bytes of CUDA: {bytes_per_token:.2} (vocab {})",
            text.len(),
            tok.vocab_size()
        );
        assert!(bytes_per_token > 2.0, "{bytes_per_token}");
        // A byte-level tokenizer without merges would be at 1.0.
        let bytes_only =
            Tokenizer::train_bpe(["".to_string()].into_iter(), 259, &SPECIAL_TOKENS).unwrap();
        let raw = bytes_only.encode(&text).unwrap().len();
        assert_eq!(raw, text.len());
    }

    #[test]
    fn save_and_load_give_the_same_ids() {
        let tok = trained();
        let dir = std::env::temp_dir().join(format!("kevin-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokenizer.json");
        tok.save(&path).unwrap();
        let back = Tokenizer::from_file(&path).unwrap();
        for s in SAMPLES {
            assert_eq!(back.encode(s).unwrap(), tok.encode(s).unwrap(), "{s:?}");
        }
        assert_eq!(back.eos_ids(), tok.eos_ids());
        // Hugging Face's own readers agree, when a Python with `tokenizers` is named.
        if let Some(python) = std::env::var_os("KEVIN_PYTHON") {
            let expected: Vec<(String, Vec<u32>)> = SAMPLES
                .iter()
                .map(|s| (s.to_string(), tok.encode(s).unwrap()))
                .collect();
            let cases = dir.join("cases.json");
            std::fs::write(&cases, serde_json::to_string(&expected).unwrap()).unwrap();
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tokenizer_parity.py");
            let out = std::process::Command::new(python)
                .arg(&script)
                .arg(&path)
                .arg(&cases)
                .output()
                .unwrap();
            println!("{}", String::from_utf8_lossy(&out.stdout));
            assert!(
                out.status.success(),
                "{}: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let missing = Tokenizer::from_file(dir.join("missing.json")).unwrap_err();
        assert!(missing.to_string().contains("missing.json"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
