//! Bad input everywhere: the config loader, the worker protocol's frame decoder and its stream
//! reader fed generated inputs (mutations of valid inputs, truncations, random bytes, frames
//! delivered in random pieces). No input may panic, and every error must be one line that names
//! what was wrong.
//!
//! `KEVIN_FUZZ_ITERS` sets the count per target (default 100,000, about 40 s on the 2-core CI
//! machine; the full runs of 1,000,000 per target are recorded in
//! benches/results/fuzz-2026-11-30.md), `KEVIN_FUZZ_SEED` the seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use kevin::config::ConfigFile;
use kevin::worker::protocol::{decode_frame, encode_frame, read_frame, FromChild, ToChild};

fn iters() -> usize {
    std::env::var("KEVIN_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(
        std::env::var("KEVIN_FUZZ_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(7),
    )
}

const TOKENS: &[&str] = &[
    "[run]",
    "[rollout]",
    "[replay]",
    "[env.simulated]",
    "[policy.simulated]",
    "[learner]",
    "[tasks]",
    "turns",
    "trajectories",
    "gamma",
    "mode",
    "max_staleness",
    "=",
    "\"sync\"",
    "\"async\"",
    "-1",
    "0",
    "1e309",
    "nan",
    "inf",
    "true",
    "[",
    "]",
    "{",
    "}",
    "\n",
    "\"",
    "'",
    "#",
    ".",
    ",",
    "999999999999999999999",
    "p_wrong",
    "preset",
    "\"gpu\"",
    "dir",
    "kind",
    "\"nvrtc\"",
    "\u{0}",
    "é",
];

fn mutate(base: &str, rng: &mut StdRng) -> String {
    let mut s: Vec<u8> = base.as_bytes().to_vec();
    for _ in 0..rng.random_range(1..4) {
        match rng.random_range(0..4) {
            0 if !s.is_empty() => {
                let i = rng.random_range(0..s.len());
                s[i] = rng.random();
            }
            1 if !s.is_empty() => {
                let i = rng.random_range(0..s.len());
                s.truncate(i);
            }
            _ => {
                let i = rng.random_range(0..=s.len());
                let t = TOKENS[rng.random_range(0..TOKENS.len())].as_bytes();
                s.splice(i..i, t.iter().copied());
            }
        }
    }
    String::from_utf8_lossy(&s).into_owned()
}

#[test]
fn config_loader_never_panics_and_errors_are_one_line() {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/quickstart.toml"
    ))
    .unwrap();
    let dir = std::env::temp_dir().join(format!("kevin-fuzz-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    let mut rng = rng();
    // One input in eight goes through the whole loader (file, config crate, validation); the
    // others through TOML parsing and validation only, which is where most bad input ends.
    let n = iters();
    for i in 0..n {
        let text = mutate(&base, &mut rng);
        let vars: Vec<(String, String)> = if i % 3 == 0 {
            vec![(
                format!("KEVIN__{}", mutate("ROLLOUT__TURNS", &mut rng)),
                mutate("4", &mut rng),
            )]
        } else {
            vec![]
        };
        if i % 8 == 0 {
            std::fs::write(&path, &text).unwrap();
            if let Err(e) = kevin::config::Config::load(Some(&path), &vars) {
                let msg = e.to_string();
                assert!(!msg.contains('\n'), "multi-line error for {text:?}: {msg}");
            }
        } else if let Ok(table) = text.parse::<toml::Table>() {
            // The validation stage on its own (the file stage is covered above).
            if let Ok(file) = toml::Value::Table(table).try_into::<ConfigFile>() {
                if let Err(e) = kevin::config::Config::from_file(file) {
                    assert!(!e.to_string().contains('\n'), "{e}");
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn frame_decoder_never_panics() {
    let mut rng = rng();
    let valid = encode_frame(
        &ToChild::Request {
            id: 7,
            body: "relu".to_string(),
        },
        1 << 20,
    )
    .unwrap();
    let reply = encode_frame(
        &FromChild::<String>::Response {
            id: 7,
            body: "ok".into(),
        },
        1 << 20,
    )
    .unwrap();
    for i in 0..iters() {
        let base = if i % 2 == 0 { &valid } else { &reply };
        let mut bytes = base.clone();
        match i % 5 {
            0 => bytes.truncate(rng.random_range(0..bytes.len())),
            1 => {
                let j = rng.random_range(0..bytes.len());
                bytes[j] = rng.random();
            }
            2 => bytes = (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
            3 => {
                // A header promising more than the limit.
                bytes[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
            }
            _ => bytes.extend((0..rng.random_range(0..8)).map(|_| rng.random::<u8>())),
        }
        if let Err(e) = decode_frame::<ToChild<String>>(&bytes, 1 << 20) {
            let msg = e.to_string();
            assert!(!msg.is_empty() && !msg.contains('\n'), "{msg:?}");
        }
        let _ = decode_frame::<FromChild<String>>(&bytes, 1 << 20);
    }
}

/// Hands out a byte stream in pieces of random size, as a pipe does.
struct Chunked<'a> {
    bytes: &'a [u8],
    rng: StdRng,
}

impl std::io::Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self
            .bytes
            .len()
            .min(buf.len())
            .min(self.rng.random_range(1..=64));
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

/// The reading side of a worker channel: streams of several frames, some valid, some mutated or
/// cut short, delivered in random pieces. Reading frame after frame must end in a clean end of
/// stream or one error (one line), never a panic, and must deliver every valid frame that comes
/// before the first damaged one.
#[test]
fn frame_stream_reader_never_panics() {
    let mut rng = rng();
    let frame = |id: u64| {
        encode_frame(
            &FromChild::<String>::Response {
                id,
                body: "ok".into(),
            },
            1 << 20,
        )
        .unwrap()
    };
    for _ in 0..iters() {
        let frames = rng.random_range(1..5u64);
        let damaged = rng.random_range(0..=frames); // == frames: none damaged
        let mut stream = Vec::new();
        for k in 0..frames {
            let mut f = frame(k);
            if k == damaged {
                match rng.random_range(0..3) {
                    0 => f.truncate(rng.random_range(0..f.len())),
                    1 => {
                        let j = rng.random_range(0..f.len());
                        f[j] ^= rng.random_range(1..=255u8);
                    }
                    _ => f = (0..rng.random_range(1..32)).map(|_| rng.random()).collect(),
                }
            }
            stream.extend(f);
        }
        let mut reader = Chunked {
            bytes: &stream,
            rng: StdRng::seed_from_u64(rng.random()),
        };
        let mut delivered = 0u64;
        loop {
            match read_frame::<_, FromChild<String>>(&mut reader, 1 << 20) {
                Ok(Some(_)) => delivered += 1,
                Ok(None) => break,
                Err(e) => {
                    assert!(!e.to_string().contains('\n'), "{e}");
                    break;
                }
            }
        }
        // Frames before the damaged one always arrive (a flipped byte in a payload may still
        // decode, so more can arrive, never fewer).
        assert!(delivered >= damaged.min(frames), "{delivered} < {damaged}");
    }
}
