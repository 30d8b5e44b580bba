//! Strided layouts for the strided kernels (broadcasts, transposes made contiguous): row-major
//! strides, broadcast strides, and the merging of dimensions that PyTorch's TensorIterator calls
//! coalescing, which keeps the per-element index arithmetic of those kernels short.

/// Row-major element strides of `shape`.
pub(super) fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut st = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * shape[i + 1] as i64;
    }
    st
}

/// (extent, stride of a, stride of b) per output dimension, outermost first, for a contiguous
/// output of shape `out` whose operands `a` and `b` broadcast to it: a broadcast dimension has
/// stride 0.
pub(super) fn broadcast_dims(out: &[usize], a: &[usize], b: &[usize]) -> Vec<(usize, i64, i64)> {
    let strides = |s: &[usize]| -> Vec<i64> {
        let pad = out.len() - s.len();
        let mut st = vec![0i64; pad];
        st.extend(
            contiguous_strides(s)
                .iter()
                .zip(s)
                .map(|(&t, &n)| if n == 1 { 0 } else { t }),
        );
        st
    };
    merge_dims(out, &strides(a), &strides(b))
}

/// `out`'s dimensions with their strides in a and b, extent-1 dimensions dropped and neighbours
/// merged where both operands allow (as TensorIterator coalesces), so `[M, N] + [N]` is two
/// dimensions and `[M, N] + [M, N]` one.
pub(super) fn merge_dims(out: &[usize], sa: &[i64], sb: &[i64]) -> Vec<(usize, i64, i64)> {
    let mut dims: Vec<(usize, i64, i64)> = Vec::new();
    for (i, &n) in out.iter().enumerate() {
        if n == 1 {
            continue;
        }
        if let Some(last) = dims.last_mut() {
            let n64 = n as i64;
            if last.1 == sa[i] * n64 && last.2 == sb[i] * n64 {
                *last = (last.0 * n, sa[i], sb[i]);
                continue;
            }
        }
        dims.push((n, sa[i], sb[i]));
    }
    if dims.is_empty() {
        dims.push((1, 0, 0));
    }
    dims
}

#[cfg(test)]
mod tests {
    use super::{broadcast_dims, contiguous_strides, merge_dims};

    #[test]
    fn broadcast_dims_merge_what_both_operands_allow() {
        // Same shape: one dimension.
        assert_eq!(broadcast_dims(&[4, 5], &[4, 5], &[4, 5]), [(20, 1, 1)]);
        // Row bias: rows broadcast in b.
        assert_eq!(
            broadcast_dims(&[4, 5], &[4, 5], &[5]),
            [(4, 5, 0), (5, 1, 1)]
        );
        // Column (keepdim) operand: [4, 1] against [4, 5].
        assert_eq!(
            broadcast_dims(&[4, 5], &[4, 1], &[4, 5]),
            [(4, 1, 5), (5, 0, 1)]
        );
        // Leading batch broadcast merges with the rows: [2, 3, 5] + [5].
        assert_eq!(
            broadcast_dims(&[2, 3, 5], &[2, 3, 5], &[5]),
            [(6, 5, 0), (5, 1, 1)]
        );
        // Extent-1 output dimensions vanish; all-ones is one element.
        assert_eq!(broadcast_dims(&[1, 5], &[1, 5], &[1]), [(5, 1, 0)]);
        assert_eq!(broadcast_dims(&[1, 1], &[1], &[1, 1]), [(1, 0, 0)]);
        // A transpose of [2, 3, 5] swapping axes 0 and 2 reads x with strides (1, 5, 15); swapping
        // the last two of [4, 3, 5] keeps the batch stride.
        let mut st = contiguous_strides(&[2, 3, 5]);
        st.swap(0, 2);
        assert_eq!(
            merge_dims(&[5, 3, 2], &st, &[0; 3]),
            [(5, 1, 0), (3, 5, 0), (2, 15, 0)]
        );
        let mut st = contiguous_strides(&[4, 3, 5]);
        st.swap(1, 2);
        assert_eq!(
            merge_dims(&[4, 5, 3], &st, &[0; 3]),
            [(4, 15, 0), (5, 1, 0), (3, 5, 0)]
        );
        // A swap of two extent-1 neighbours of a contiguous tensor is one dimension.
        assert_eq!(merge_dims(&[3, 1, 4], &[4, 4, 1], &[0; 3]), [(12, 1, 0)]);
    }
}
