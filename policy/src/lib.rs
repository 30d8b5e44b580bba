//! kevin's policy in burn: a Qwen2-architecture decoder, Hugging Face checkpoints, batched
//! sampling with a KV cache, and the learner that trains it from the replay queue.
#![warn(missing_docs)]
