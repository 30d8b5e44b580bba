//! Size expressions: the dims that are computed from other dims, such as a convolution's output
//! length `(H + 2 - 3) // 2 + 1` or a flattened `C*H*W`. They are kept in a normal form, so that
//! two dims agree exactly when their normal forms are equal (sound, and complete for the sums,
//! products and floor divisions by a literal that shapes need).
//!
//! The normal form is a polynomial with integer coefficients over *atoms*: size symbols and floor
//! quotients `(p) // k` of a normalised polynomial `p` by a literal `k >= 2` whose coefficients
//! all lie in `0..k` (anything divisible by `k` is taken out of the quotient first).

use std::collections::BTreeMap;
use std::fmt;

use super::ast::Sizes;

/// A factor of a monomial.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Atom {
    /// A size symbol.
    Sym(String),
    /// `(p) // k`, floor division by a literal `k >= 2`.
    Floor(Box<Poly>, i64),
}

/// A polynomial over atoms: monomial (a sorted list of atoms; empty for the constant) to its
/// non-zero coefficient.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Poly {
    terms: BTreeMap<Vec<Atom>, i64>,
}

impl Poly {
    /// The constant `c`.
    pub fn lit(c: i64) -> Poly {
        let mut p = Poly::default();
        p.add_term(Vec::new(), c);
        p
    }

    /// The symbol `s`.
    pub fn sym(s: &str) -> Poly {
        let mut p = Poly::default();
        p.add_term(vec![Atom::Sym(s.to_string())], 1);
        p
    }

    fn add_term(&mut self, mono: Vec<Atom>, c: i64) {
        if c == 0 {
            return;
        }
        let e = self.terms.entry(mono).or_insert(0);
        *e += c;
        if *e == 0 {
            self.terms.retain(|_, v| *v != 0);
        }
    }

    /// `self + other`.
    pub fn add(&self, other: &Poly) -> Poly {
        let mut p = self.clone();
        for (m, c) in &other.terms {
            p.add_term(m.clone(), *c);
        }
        p
    }

    /// `self - other`.
    pub fn sub(&self, other: &Poly) -> Poly {
        self.add(&other.scale(-1))
    }

    /// `c * self`.
    pub fn scale(&self, c: i64) -> Poly {
        let mut p = Poly::default();
        for (m, v) in &self.terms {
            p.add_term(m.clone(), v * c);
        }
        p
    }

    /// `self * other`.
    pub fn mul(&self, other: &Poly) -> Poly {
        let mut p = Poly::default();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m = ma.clone();
                m.extend(mb.iter().cloned());
                m.sort();
                p.add_term(m, ca * cb);
            }
        }
        p
    }

    /// `self // k` (floor division by a positive literal), normalised.
    pub fn floor_div(&self, k: i64) -> Poly {
        assert!(k > 0, "floor division by {k}");
        if k == 1 {
            return self.clone();
        }
        // self = k*q + r with every coefficient of r in 0..k; then self // k = q + r // k.
        let (mut q, mut r) = (Poly::default(), Poly::default());
        for (m, c) in &self.terms {
            q.add_term(m.clone(), c.div_euclid(k));
            r.add_term(m.clone(), c.rem_euclid(k));
        }
        match r.constant() {
            Some(c) => q.add(&Poly::lit(c / k)),
            None => {
                let mut atom = Poly::default();
                atom.add_term(vec![Atom::Floor(Box::new(r), k)], 1);
                q.add(&atom)
            }
        }
    }

    /// The value when the polynomial has no symbol.
    pub fn constant(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// The symbol when the polynomial is exactly one symbol.
    pub fn as_sym(&self) -> Option<&str> {
        let (m, c) = self.terms.iter().next()?;
        match (self.terms.len(), m.as_slice(), c) {
            (1, [Atom::Sym(s)], 1) => Some(s),
            _ => None,
        }
    }

    /// The value under `sizes`, or `None` when a symbol is unbound.
    pub fn eval(&self, sizes: &Sizes) -> Option<i64> {
        let mut total = 0i64;
        for (m, c) in &self.terms {
            let mut v = *c;
            for a in m {
                v = v.checked_mul(a.eval(sizes)?)?;
            }
            total = total.checked_add(v)?;
        }
        Some(total)
    }

    /// The same expression with every symbol renamed by `f`.
    pub fn rename(&self, f: &mut dyn FnMut(&str) -> String) -> Poly {
        let mut p = Poly::default();
        for (m, c) in &self.terms {
            let mut mono: Vec<Atom> = m
                .iter()
                .map(|a| match a {
                    Atom::Sym(s) => Atom::Sym(f(s)),
                    Atom::Floor(q, k) => Atom::Floor(Box::new(q.rename(f)), *k),
                })
                .collect();
            mono.sort();
            p.add_term(mono, *c);
        }
        p
    }

    /// Every symbol, in order of first appearance in the rendering.
    pub fn symbols(&self, out: &mut Vec<String>) {
        for m in self.terms.keys() {
            for a in m {
                match a {
                    Atom::Sym(s) => {
                        if !out.contains(s) {
                            out.push(s.clone())
                        }
                    }
                    Atom::Floor(p, _) => p.symbols(out),
                }
            }
        }
    }
}

impl Atom {
    fn eval(&self, sizes: &Sizes) -> Option<i64> {
        match self {
            Atom::Sym(s) => sizes.get(s).map(|&v| v as i64),
            Atom::Floor(p, k) => Some(p.eval(sizes)?.div_euclid(*k)),
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Sym(s) => f.write_str(s),
            Atom::Floor(p, k) => write!(f, "({p}) // {k}"),
        }
    }
}

/// Renders in the op language's dim syntax (`2*H + 1`, `(H + 1) // 2 - 1`), which
/// [`super::parse`] reads back to the same normal form. Constants come last.
impl fmt::Display for Poly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut terms: Vec<(&Vec<Atom>, i64)> = self.terms.iter().map(|(m, c)| (m, *c)).collect();
        terms.sort_by_key(|(m, _)| m.is_empty());
        if terms.is_empty() {
            return f.write_str("0");
        }
        for (i, (m, c)) in terms.iter().enumerate() {
            let (neg, a) = (*c < 0, c.unsigned_abs());
            match (i, neg) {
                (0, true) => f.write_str("-")?,
                (0, false) => {}
                (_, true) => f.write_str(" - ")?,
                (_, false) => f.write_str(" + ")?,
            }
            if m.is_empty() {
                write!(f, "{a}")?;
                continue;
            }
            if a != 1 {
                write!(f, "{a}*")?;
            }
            for (j, atom) in m.iter().enumerate() {
                if j > 0 {
                    f.write_str("*")?;
                }
                match atom {
                    // A product or a scaled quotient needs the quotient in parentheses.
                    Atom::Floor(..) if m.len() > 1 || a != 1 => write!(f, "({atom})")?,
                    _ => write!(f, "{atom}")?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h() -> Poly {
        Poly::sym("H")
    }

    #[test]
    fn normal_forms_agree_on_equal_expressions() {
        // (H + 2*1 - 1*(3 - 1) - 1) // 1 + 1 == H
        let conv = h()
            .add(&Poly::lit(2 - 2 - 1))
            .floor_div(1)
            .add(&Poly::lit(1));
        assert_eq!(conv, h());
        assert_eq!(conv.as_sym(), Some("H"));
        // (2*H + 4) // 2 == H + 2 exactly; (2*H + 5) // 2 == H + 2 as well.
        let two_h = h().scale(2);
        assert_eq!(
            two_h.add(&Poly::lit(4)).floor_div(2),
            h().add(&Poly::lit(2))
        );
        assert_eq!(
            two_h.add(&Poly::lit(5)).floor_div(2),
            h().add(&Poly::lit(2))
        );
        // (H - 3) // 2 + 1 keeps its quotient, normalised to (H + 1) // 2 - 1: the same value.
        let strided = h().sub(&Poly::lit(3)).floor_div(2).add(&Poly::lit(1));
        assert_eq!(strided.to_string(), "(H + 1) // 2 - 1");
        for v in 3..40 {
            let sizes: Sizes = [("H".to_string(), v as usize)].into();
            assert_eq!(strided.eval(&sizes), Some((v - 3) / 2 + 1), "H = {v}");
        }
        // Products commute.
        let (c, w) = (Poly::sym("C"), Poly::sym("W"));
        assert_eq!(c.mul(&h()).mul(&w), w.mul(&c).mul(&h()));
        assert_eq!(c.mul(&h()).mul(&w).to_string(), "C*H*W");
        assert_eq!(Poly::lit(7).constant(), Some(7));
        assert_eq!(h().sub(&h()).constant(), Some(0));
    }
}
