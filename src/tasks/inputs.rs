//! Input distributions of task files and deterministic input generation. Each input draws from
//! its own `StdRng` seeded from the trial seed and the input's position, so adding an input to a
//! task does not change the values of the others; values are rounded to the input's dtype.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

use crate::ops::round::round_to;
use crate::ops::{Program, Sizes};

/// How the values of one input are drawn (`dist = "..."` in a task file).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
pub enum InputDist {
    /// Normal with `mean` (default 0) and `std` (default 1).
    Normal {
        /// Mean.
        #[serde(default)]
        mean: f64,
        /// Standard deviation.
        #[serde(default = "one")]
        std: f64,
    },
    /// Uniform on `[lo, hi)`.
    Uniform {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// `min + |N(0, std)|`: strictly positive values for `log`, `sqrt` and friends (defaults:
    /// `min` 0.1, `std` 1).
    Positive {
        /// Smallest value.
        #[serde(default = "tenth")]
        min: f64,
        /// Spread above `min`.
        #[serde(default = "one")]
        std: f64,
    },
    /// `lo + step * k` with `k` uniform in `0 .. count`: labels and masks drawn as floats
    /// (`torch.randint(0, 2, shape).float()` is `lo = 0, step = 1, count = 2`; `* 2 - 1` makes
    /// it the signs `lo = -1, step = 2`).
    Grid {
        /// The first value.
        lo: f64,
        /// Between two values.
        step: f64,
        /// Number of values (at least 1, at most 2^24).
        count: u32,
    },
    /// Uniform on `[lo, hi)` times one factor uniform in `[0, 1)` for the whole tensor, drawn
    /// anew with every tensor (KernelBench's `torch.rand(shape) * torch.rand(())`).
    #[serde(rename = "scaled_uniform")]
    ScaledUniform {
        /// Lower bound before the factor.
        lo: f64,
        /// Upper bound before the factor.
        hi: f64,
    },
    /// Uniform on `[lo, hi)` on and above the diagonal of every square matrix of the last two
    /// axes, zero below (`torch.triu(torch.rand(n, n))`).
    Upper {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// Uniform on `[lo, hi)` on and below the diagonal, zero above (`torch.tril`).
    Lower {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// Uniform on `[lo, hi)`, every square matrix of the last two axes symmetric (KernelBench's
    /// `(A + A.T) / 2` of a uniform draw, as a symmetric uniform draw).
    Symmetric {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
}

fn one() -> f64 {
    1.0
}

fn tenth() -> f64 {
    0.1
}

impl Default for InputDist {
    fn default() -> Self {
        InputDist::Normal {
            mean: 0.0,
            std: 1.0,
        }
    }
}

impl InputDist {
    /// Checks the parameters; the message says which is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |v: f64, n: &str| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("`{n}` must be finite"))
            }
        };
        match *self {
            InputDist::Normal { mean, std } => {
                finite(mean, "mean")?;
                finite(std, "std")?;
                if std < 0.0 {
                    return Err("`std` must be >= 0".into());
                }
            }
            InputDist::Uniform { lo, hi }
            | InputDist::ScaledUniform { lo, hi }
            | InputDist::Upper { lo, hi }
            | InputDist::Lower { lo, hi }
            | InputDist::Symmetric { lo, hi } => {
                finite(lo, "lo")?;
                finite(hi, "hi")?;
                if lo >= hi {
                    return Err(format!("`lo` ({lo}) must be below `hi` ({hi})"));
                }
            }
            InputDist::Positive { min, std } => {
                finite(std, "std")?;
                if !(min > 0.0 && min.is_finite()) {
                    return Err("`min` must be positive".into());
                }
                if std < 0.0 {
                    return Err("`std` must be >= 0".into());
                }
            }
            InputDist::Grid { lo, step, count } => {
                finite(lo, "lo")?;
                finite(step, "step")?;
                if !(1..=1 << 24).contains(&count) {
                    return Err(format!("`count` ({count}) must be in 1 ..= 16777216"));
                }
            }
        }
        Ok(())
    }

    /// The PyTorch expression drawing a tensor of `dims` and `dtype` from this distribution, or
    /// `None` for the standard normal (`torch.randn`, the renderer's default).
    pub fn torch_expr(&self, dims: &str, dtype: &str) -> Option<String> {
        let r = |f: &str| format!("torch.{f}({dims}, dtype={dtype})");
        match *self {
            InputDist::Normal { mean, std } if mean == 0.0 && std == 1.0 => None,
            // A constant (a parameter at its initial value): what PyTorch would write.
            InputDist::Normal { mean, std } if std == 0.0 && !dims.is_empty() => {
                Some(format!("torch.full(({dims},), {mean:?}, dtype={dtype})"))
            }
            InputDist::Normal { mean: 0.0, std } => Some(format!("{} * {std:?}", r("randn"))),
            InputDist::Normal { mean, std } => Some(format!("{} * {std:?} + {mean:?}", r("randn"))),
            InputDist::Uniform { lo, hi } => {
                Some(format!("{} * {:?} + {lo:?}", r("rand"), hi - lo))
            }
            InputDist::Positive { min, std } => {
                Some(format!("{}.abs() * {std:?} + {min:?}", r("randn")))
            }
            // Integers (labels, indices) stay integers: no float step or offset.
            InputDist::Grid { lo, step, count } if dtype == "torch.int64" => Some(format!(
                "torch.randint(0, {count}, ({dims},)) * {} + {}",
                step.round() as i64,
                lo.round() as i64
            )),
            InputDist::Grid { lo, step, count } => Some(format!(
                "torch.randint(0, {count}, ({dims},)).to({dtype}) * {step:?} + {lo:?}"
            )),
            InputDist::ScaledUniform { lo, hi } => Some(format!(
                "({} * {:?} + {lo:?}) * torch.rand(())",
                r("rand"),
                hi - lo
            )),
            InputDist::Upper { lo, hi } | InputDist::Lower { lo, hi } => Some(format!(
                "torch.{}({} * {:?} + {lo:?})",
                if matches!(self, InputDist::Upper { .. }) { "triu" } else { "tril" },
                r("rand"),
                hi - lo
            )),
            InputDist::Symmetric { lo, hi } => Some(format!(
                "(lambda u: torch.triu(u) + torch.triu(u, 1).transpose(-2, -1))({} * {:?} + {lo:?})",
                r("rand"),
                hi - lo
            )),
        }
    }

    /// True for the distributions drawn over square matrices of the last two axes.
    pub fn is_matrix(&self) -> bool {
        matches!(
            self,
            InputDist::Upper { .. } | InputDist::Lower { .. } | InputDist::Symmetric { .. }
        )
    }

    fn sample(&self, rng: &mut StdRng) -> f64 {
        match *self {
            InputDist::Normal { mean, std } => mean + std * standard_normal(rng),
            InputDist::Uniform { lo, hi } => lo + (hi - lo) * rng.random::<f64>(),
            InputDist::Positive { min, std } => min + (std * standard_normal(rng)).abs(),
            InputDist::Grid { lo, step, count } => {
                lo + step * rng.random_range(0..count.max(1)) as f64
            }
            // The tensor's factor and the matrices' structure are applied by `generate`.
            InputDist::ScaledUniform { lo, hi }
            | InputDist::Upper { lo, hi }
            | InputDist::Lower { lo, hi }
            | InputDist::Symmetric { lo, hi } => lo + (hi - lo) * rng.random::<f64>(),
        }
    }
}

/// Box-Muller (one of the pair; simplicity over speed).
fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>(); // in (0, 1]
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// One vector per input of `program`, drawn from `dists` at `sizes`.
pub fn generate(program: &Program, dists: &[InputDist], sizes: &Sizes, seed: u64) -> Vec<Vec<f64>> {
    program
        .inputs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let n: usize = d.ty.concrete_shape(sizes).map_or(0, |s| s.iter().product());
            let stream = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut rng = StdRng::seed_from_u64(seed ^ stream);
            let dist = dists.get(i).copied().unwrap_or_default();
            let factor = match dist {
                InputDist::ScaledUniform { .. } => rng.random::<f64>(),
                _ => 1.0,
            };
            let mut v: Vec<f64> = (0..n)
                .map(|_| round_to(d.ty.dtype, dist.sample(&mut rng) * factor))
                .collect();
            // The square matrices of the last two axes (the task file checks they are).
            let cols =
                d.ty.concrete_shape(sizes)
                    .ok()
                    .and_then(|s| s.last().copied());
            if let (true, Some(cols @ 1..)) = (dist.is_matrix(), cols) {
                for k in 0..v.len() {
                    let (row, col) = ((k / cols) % cols, k % cols);
                    match dist {
                        InputDist::Upper { .. } if col < row => v[k] = 0.0,
                        InputDist::Lower { .. } if col > row => v[k] = 0.0,
                        // Below the diagonal, the element above it (drawn, never changed).
                        InputDist::Symmetric { .. } if col < row => {
                            v[k] = v[k - row * cols - col + col * cols + row]
                        }
                        _ => {}
                    }
                }
            }
            v
        })
        .collect()
}
