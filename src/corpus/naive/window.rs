//! Naive kernels for the operations over `x: [N, C, *spatial]`: convolutions (plain, strided,
//! dilated, grouped, transposed), max and average pooling, and the norms over channels (group,
//! instance, batch), each with elementwise work before it (on its input) and after it.
//!
//! A convolution or a pooling is a gather: one thread per output element walks its window,
//! skipping the positions in the padding (zeros for a convolution, nothing for a pooling), so
//! the kernel is the definition read as loops. A norm over channels needs its set's statistics
//! first: a block per set (a sample's group of channels, or a channel over the batch) makes two
//! strided passes with block-wide tree reductions (the mean, then the biased variance around
//! it), then normalises. Sizes computed from others (a strided output's length) reach the
//! kernel as size parameters, so the loops read like the definition.

use super::{dim, paren, product, product_or_one, tree_fn, Ctx, Generated};
use crate::corpus::scalar::{float_lit, long_product};
use crate::ops::ast::{Dim, Expr, NormSets, Op, ReduceKind};

/// True for the operations this writer takes: convolutions, poolings and norms over channels.
pub(super) fn is_windowed(op: &Op) -> bool {
    matches!(
        op,
        Op::Conv { .. } | Op::Pool { .. } | Op::ChannelNorm { .. }
    )
}

/// The spatial coordinates of a flat output index, innermost last: C statements that peel
/// `o{d}` off `r` for every spatial axis, then the channel `oc` and the sample `n`.
fn peel(out: &[Dim]) -> String {
    let mut s = String::from("        long long r = i;\n");
    for d in (2..out.len()).rev() {
        let o = dim(&out[d]);
        s += &format!(
            "        int o{k} = (int)(r % {o});\n        r /= {o};\n",
            k = d - 2
        );
    }
    s += &format!(
        "        int oc = (int)(r % {c});\n        long long n = r / {c};\n",
        c = dim(&out[1])
    );
    s
}

/// Nested loops over a window of `kernel` (one per spatial axis, `q{d}`), each computing the
/// input position `p{d}` by `pos(d)` and skipping it by `skip(d)`; `body` at the innermost.
fn window_loops(
    kernel: &[String],
    pos: &dyn Fn(usize) -> String,
    skip: &dyn Fn(usize) -> String,
    body: &str,
    indent: usize,
) -> String {
    let mut s = String::new();
    for (d, k) in kernel.iter().enumerate() {
        let pad = " ".repeat(indent + 4 * d);
        s += &format!(
            "{pad}for (int q{d} = 0; q{d} < {k}; ++q{d}) {{\n{pad}    {}\n{pad}    if ({}) continue;\n",
            pos(d),
            skip(d)
        );
    }
    let pad = " ".repeat(indent + 4 * kernel.len());
    for line in body.lines() {
        s += &format!("{pad}{line}\n");
    }
    for d in (0..kernel.len()).rev() {
        s += &format!("{}}}\n", " ".repeat(indent + 4 * d));
    }
    s
}

/// `((plane * L0 + p0) * L1 + p1)...`: the flat index of position `{var}0, {var}1, ...` in
/// plane `plane` of a tensor whose spatial extents are `extents`.
fn spatial_index(plane: &str, extents: &[String], var: &str) -> String {
    extents
        .iter()
        .enumerate()
        .fold(plane.to_string(), |acc, (d, l)| {
            format!("({acc}) * {l} + {var}{d}")
        })
}

impl Ctx<'_> {
    /// The one convolution, pooling or norm over channels in `e`, with elementwise work before
    /// and after it, as a kernel (None when `e` is not of that shape).
    pub(super) fn windowed(&self, e: &Expr) -> Option<Vec<Generated>> {
        let mut found = Vec::new();
        super::find_calls(e, &is_windowed, &mut found);
        let [call] = found.as_slice() else {
            return None;
        };
        let Expr::Call { op, args } = call else {
            return None;
        };
        let x_e = args.first()?;
        let out = self.out_shape().to_vec();
        let x_shape = self.iteration_shape(x_e)?;
        if out.len() < 2 || x_shape.len() != out.len() || self.iteration_shape(e)? != out {
            return None;
        }
        match op {
            Op::ChannelNorm { .. } if x_shape == out => self.channel_norm(e, call),
            Op::Pool { .. } | Op::Conv { .. } if out.len() > 2 && x_shape[0] == out[0] => {
                self.gather(e, call, &x_shape)
            }
            _ => None,
        }
    }

    /// Operand `i` of `args` when it is a tensor: its name and shape.
    fn tensor_arg(&self, args: &[Expr], i: usize) -> Option<(String, Vec<Dim>)> {
        match args.get(i)? {
            Expr::Var(v) => Some((v.clone(), self.shapes.get(v)?.clone())),
            _ => None,
        }
    }

    /// A convolution or a pooling (`call`, over `x: x_shape`) in `e`: a thread per output element
    /// walks its window.
    fn gather(&self, e: &Expr, call: &Expr, x_shape: &[Dim]) -> Option<Vec<Generated>> {
        let Expr::Call { op, args } = call else {
            return None;
        };
        let x_e = args.first()?;
        let out = self.out_shape().to_vec();
        let spatial: Vec<String> = x_shape[2..].iter().map(dim).collect();
        let c_in = dim(&x_shape[1]);
        let mut pre = self.render(x_shape, "xi");
        let v = pre.scalar(x_e)?;
        let plain = |d: usize, stride: &[usize], padding: &[usize], dilation: &[usize]| {
            format!(
                "int p{d} = {}{}{};",
                times(&format!("o{d}"), stride[d]),
                minus(padding[d]),
                plus_times(&format!("q{d}"), dilation[d])
            )
        };
        let outside = |d: usize| format!("p{d} < 0 || p{d} >= {}", spatial[d]);
        let (body, words) = match op {
            Op::Conv {
                transposed,
                stride,
                padding,
                dilation,
                groups,
                bias,
                ..
            } => {
                let (w, w_shape) = self.tensor_arg(args, 1)?;
                if w_shape.len() != out.len() {
                    return None;
                }
                let bias = if *bias {
                    Some(self.tensor_arg(args, 2)?.0)
                } else {
                    None
                };
                let kernel: Vec<String> = w_shape[2..].iter().map(dim).collect();
                // Channels per group, of the input and of the output; with one group the loop
                // runs over the input channels themselves.
                let (cpg, fpg) = (per_group(&x_shape[1], *groups), per_group(&out[1], *groups));
                let (cg, oc_in_group) = if *groups == 1 {
                    ("ic", "oc".to_string())
                } else {
                    ("cg", format!("oc % {fpg}"))
                };
                let w_at = if *transposed {
                    // weight [C, F/groups, *kernel]: input channel, then the output channel
                    // within its group.
                    spatial_index(
                        &format!("(long long)ic * {fpg} + {oc_in_group}"),
                        &kernel,
                        "q",
                    )
                } else {
                    // weight [F, C/groups, *kernel].
                    spatial_index(&format!("(long long)oc * {cpg} + {cg}"), &kernel, "q")
                };
                let pos = |d: usize| {
                    if *transposed {
                        // Output o gathers input p where o = p * stride - padding + q * dilation.
                        format!(
                            "int p{d} = o{d}{} - {};",
                            plus(padding[d]),
                            times(&format!("q{d}"), dilation[d])
                        )
                    } else {
                        plain(d, stride, padding, dilation)
                    }
                };
                let skip = |d: usize| {
                    if *transposed {
                        format!(
                            "p{d} < 0 || p{d} % {s} != 0 || p{d} / {s} >= {l}",
                            s = stride[d],
                            l = spatial[d]
                        )
                    } else {
                        outside(d)
                    }
                };
                let x_at = if *transposed {
                    // The gathered position is p / stride.
                    let mut idx = format!("n * {c_in} + ic");
                    for (d, l) in spatial.iter().enumerate() {
                        idx = format!("({idx}) * {l} + p{d} / {}", stride[d]);
                    }
                    idx
                } else {
                    spatial_index(&format!("n * {c_in} + ic"), &spatial, "p")
                };
                let inner = format!(
                    "long long xi = {x_at};\nacc += {v} * {};",
                    self.ld(&w, &w_at)
                );
                let loops = window_loops(&kernel, &pos, &skip, &inner, 12);
                let init = match &bias {
                    Some(b) => self.ld(b, "oc"),
                    None => "0.0f".into(),
                };
                // The input channels of output channel oc's group.
                let channels = if *groups == 1 {
                    format!("        for (int ic = 0; ic < {cpg}; ++ic) {{\n")
                } else {
                    format!(
                        "        int grp = oc / {fpg};\n        for (int cg = 0; cg < {cpg}; ++cg) {{\n            \
                         int ic = grp * {cpg} + cg;\n"
                    )
                };
                let body = format!(
                    "        float acc = {init};\n{channels}{loops}        }}\n        float t = acc;\n"
                );
                let what = if *transposed {
                    format!(
                        "a transposed convolution (stride {}, padding {}): output position o takes input \
                         position p wherever o = p * stride - padding + q * dilation for a kernel offset q, so \
                         for each offset the thread computes o + padding - q * dilation and uses it only when \
                         it is a non-negative multiple of the stride inside the input",
                        list(stride),
                        list(padding)
                    )
                } else {
                    format!(
                        "a convolution (stride {}, padding {}, dilation {}, {groups} group(s)): output position \
                         o reads input position o * stride - padding + q * dilation for every kernel offset q, \
                         and a position in the padding contributes zero, so it is skipped",
                        list(stride),
                        list(padding),
                        list(dilation)
                    )
                };
                (body, what)
            }
            Op::Pool {
                max,
                kernel,
                stride,
                padding,
                dilation,
                count_include_pad,
                ..
            } => {
                if x_shape[1] != out[1] {
                    return None;
                }
                let window = list(kernel);
                let kernel: Vec<String> = kernel.iter().map(|k| k.to_string()).collect();
                let pos = |d: usize| plain(d, stride, padding, dilation);
                let plane = format!("n * {c_in} + oc");
                let x_at = spatial_index(&plane, &spatial, "p");
                let (init, inner, fin) = if *max {
                    (
                        "        float m = -__int_as_float(0x7f800000);\n".to_string(),
                        format!(
                            "long long xi = {x_at};\nfloat xv = {v};\nif (xv > m || xv != xv) m = xv;"
                        ),
                        "        float t = m;\n".to_string(),
                    )
                } else if *count_include_pad {
                    (
                        "        float s = 0.0f;\n".to_string(),
                        format!("long long xi = {x_at};\ns += {v};"),
                        format!("        float t = s / (float)({});\n", kernel.join(" * ")),
                    )
                } else {
                    (
                        "        float s = 0.0f;\n        int cnt = 0;\n".to_string(),
                        format!("long long xi = {x_at};\ns += {v};\n++cnt;"),
                        "        float t = s / (float)cnt;\n".to_string(),
                    )
                };
                let loops = window_loops(&kernel, &pos, &outside, &inner, 8);
                let what = format!(
                    "{} pooling (window {}, stride {}, padding {}): output position o covers input positions \
                     o * stride - padding + q * dilation, and the positions in the padding are skipped ({})",
                    if *max { "max" } else { "average" },
                    window,
                    list(stride),
                    list(padding),
                    if *max {
                        "they never win; a NaN in the window wins, as in PyTorch"
                    } else if *count_include_pad {
                        "the sum is still divided by the whole window, as count_include_pad asks"
                    } else {
                        "the sum is divided by the positions inside the input"
                    }
                );
                (format!("{init}{loops}{fin}"), what)
            }
            _ => return None,
        };
        let mut post = self.render(&out, "i");
        post.inherit_helpers(&pre);
        post.row_value = Some((call.clone(), "t".into()));
        let value = self.st(&post.scalar(e)?);
        let helpers = post.helpers();
        let y = &self.out;
        let total = product(&out);
        let kern = self.kernel("window");
        let src = format!(
            "{launch}\n{helpers}{sig} {{\n    long long total = {nll};\n    \
             for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;\n         \
             i += (long long)gridDim.x * blockDim.x) {{\n{peel}{body}        {y}[i] = {value};\n    }}\n}}\n",
            launch = self.launch(&kern, &format!("cdiv({total},256)"), "256"),
            sig = self.signature(&kern),
            nll = long_product(&out),
            peel = peel(&out),
        );
        let what = self.program_text();
        Some(vec![Generated {
            form: "window_thread_per_output".into(),
            source: src,
            reasoning: format!(
                "`{what}` is {words}. Every output element depends only on its own window, so the simplest \
                 correct kernel gives each of the {total} output elements a thread: it peels its spatial \
                 coordinates, channel and sample off the flat index, walks the window in float registers \
                 (the elementwise work on the input applied at each read), then applies the elementwise \
                 work after it and stores once."
            ),
            summary: format!(
                "One thread per output element (256-thread blocks, cdiv({total},256) of them, a grid-stride \
                 loop for safety): the window walked with bounds checks for the padding, float accumulation, \
                 one store per element."
            ),
        }])
    }

    /// A norm over channels (`call`, over an input of the output's shape) in `e`: a thread or a
    /// block per set of elements that share statistics.
    fn channel_norm(&self, e: &Expr, call: &Expr) -> Option<Vec<Generated>> {
        let Expr::Call {
            op:
                Op::ChannelNorm {
                    sets,
                    eps,
                    weight,
                    bias,
                },
            args,
        } = call
        else {
            return None;
        };
        let (sets, eps) = (*sets, *eps);
        let x_e = args.first()?;
        let weight = if *weight {
            Some(self.tensor_arg(args, 1)?.0)
        } else {
            None
        };
        let bias = if *bias {
            Some(self.tensor_arg(args, 1 + usize::from(weight.is_some()))?.0)
        } else {
            None
        };
        let out = self.out_shape().to_vec();
        let n = dim(&out[0]);
        let c = dim(&out[1]);
        let s = product_or_one(&out[2..]);
        let ps = paren(&s);
        // (number of sets, elements per set, index of element j of set `set`, its channel)
        let (count, len, at, channel, words) = match sets {
            NormSets::Batch => (
                c.clone(),
                format!("(long long){n} * {s}"),
                format!("(long long)(j / {ps}) * {c} * {s} + (long long)set * {s} + j % {ps}"),
                "set".to_string(),
                "batch norm in training mode: each channel's statistics over the whole batch and every \
                 spatial position"
                    .to_string(),
            ),
            NormSets::Groups(_) | NormSets::Instance => {
                let g = match sets {
                    NormSets::Groups(g) => g.to_string(),
                    _ => c.clone(),
                };
                let cpg = if g == c {
                    "1".to_string()
                } else {
                    format!("({} / {g})", paren(&c))
                };
                (
                    format!("{n} * {g}"),
                    format!("(long long){cpg} * {s}"),
                    "(long long)set * len + j".to_string(),
                    format!("(int)(set % {g}) * {cpg} + (int)(j / {ps})"),
                    if g == c {
                        "instance norm: each sample's channels normalised one by one over their spatial \
                         positions"
                            .to_string()
                    } else {
                        format!(
                            "group norm: each sample's channels in {g} groups, a group's statistics over its \
                             channels and their spatial positions (a contiguous run of memory)"
                        )
                    },
                )
            }
        };
        let mut pre = self.render(&out, "idx");
        let v = pre.scalar(x_e)?;
        let mut post = self.render(&out, "idx");
        post.inherit_helpers(&pre);
        post.row_value = Some((call.clone(), "t".into()));
        let value = self.st(&post.scalar(e)?);
        let helpers = post.helpers();
        let mut t = "(xv - mean) * inv".to_string();
        if let Some(w) = &weight {
            t = format!("{t} * {}", self.ld(w, "ch"));
        }
        if let Some(b) = &bias {
            t = format!("{t} + {}", self.ld(b, "ch"));
        }
        let y = &self.out;
        // The three passes over a set: `each` visits its elements, `red` makes a partial sum
        // the set's (nothing for a thread per set, a block-wide tree for a block per set).
        let passes = |each: &str, red: &dyn Fn(&str) -> String| {
            format!(
                "    long long len = {len};\n    float mean = 0.0f;\n    \
                 {each} {{\n        long long idx = {at};\n        mean += {v};\n    }}\n    \
                 mean = {} / (float)len;\n    float var = 0.0f;\n    \
                 {each} {{\n        long long idx = {at};\n        float dv = {v} - mean;\n        var += dv * dv;\n    }}\n    \
                 var = {} / (float)len;\n    float inv = rsqrtf(var + {eps});\n    \
                 {each} {{\n        long long idx = {at};\n        int ch = {channel};\n        float xv = {v};\n        \
                 float t = {t};\n        {y}[idx] = {value};\n    }}\n}}\n",
                red("mean"),
                red("var"),
                eps = float_lit(eps),
            )
        };
        let what = self.program_text();
        let kern = self.kernel("channel_norm_thread");
        let thread = format!(
            "{launch}\n{helpers}{sig} {{\n    long long set = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    \
             if (set >= (long long){count}) return;\n{body}",
            launch = self.launch(&kern, &format!("cdiv({count},64)"), "64"),
            sig = self.signature(&kern),
            body = passes("for (long long j = 0; j < len; ++j)", &|v| v.to_string()),
        );
        let block = 256;
        let kern = self.kernel("channel_norm");
        let tree = format!(
            "{launch}\n#define BLOCK {block}\n{tree}{helpers}{sig} {{\n    __shared__ float buf[BLOCK];\n    \
             long long set = blockIdx.x;\n{body}",
            launch = self.launch(&kern, &count, &block.to_string()),
            tree = tree_fn(ReduceKind::Sum)?,
            sig = self.signature(&kern),
            body = passes(
                "for (long long j = threadIdx.x; j < len; j += BLOCK)",
                &|v| format!("kevin_block_sum({v}, buf)")
            ),
        );
        Some(vec![
            Generated {
                form: "channel_norm_thread_per_set".into(),
                source: thread,
                reasoning: format!(
                    "`{what}` is a {words}. Every output element needs its set's mean and variance. The \
                     simplest correct kernel gives each of the {count} sets its own thread (64-thread blocks), \
                     which walks the set three times: the sum for the mean, the squared deviations for the \
                     biased variance (two passes are more accurate than E[x^2] - mean^2), then the normalised \
                     values with the channel's affine parameters and the elementwise work after the norm."
                ),
                summary: format!(
                    "One thread per set (cdiv({count},64) blocks of 64): three sequential passes in float \
                     registers, the elementwise parts fused into them, one store per element."
                ),
            },
            Generated {
                form: "channel_norm_block".into(),
                source: tree,
                reasoning: format!(
                    "`{what}` is a {words}. Every output element needs its set's mean and variance, so give each \
                     of the {count} sets a block of {block} threads: one strided pass sums the set for the mean, a \
                     second sums the squared deviations for the biased variance (two passes are more accurate than \
                     E[x^2] - mean^2), each combined by a shared-memory tree, and a third pass normalises, applies \
                     the channel's affine parameters and the elementwise work after the norm."
                ),
                summary: format!(
                    "One {block}-thread block per set ({count} blocks): coalesced strided passes, block-wide tree \
                     reductions in shared memory for the mean and variance, the elementwise parts fused into the \
                     passes, one store per element."
                ),
            },
        ])
    }
}

/// The channels per group of `d` channels in `groups` groups, as C.
fn per_group(d: &Dim, groups: usize) -> String {
    match d {
        _ if groups == 1 => dim(d),
        Dim::Lit(v) => (v / groups).to_string(),
        _ => format!("({} / {groups})", paren(&dim(d))),
    }
}

/// `v * k`, or `v` when `k` is 1.
fn times(v: &str, k: usize) -> String {
    if k == 1 {
        v.to_string()
    } else {
        format!("{v} * {k}")
    }
}

/// ` + v * k` (` + v` when `k` is 1).
fn plus_times(v: &str, k: usize) -> String {
    format!(" + {}", times(v, k))
}

/// ` + k`, nothing when `k` is 0.
fn plus(k: usize) -> String {
    if k == 0 {
        String::new()
    } else {
        format!(" + {k}")
    }
}

/// ` - k`, nothing when `k` is 0.
fn minus(k: usize) -> String {
    if k == 0 {
        String::new()
    } else {
        format!(" - {k}")
    }
}

/// `2` for one value, `(2, 1)` for several.
fn list(v: &[usize]) -> String {
    match v {
        [one] => one.to_string(),
        _ => format!(
            "({})",
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
