//! What is known about a value before anything runs: its element type, its shape with static
//! or symbolic dimensions, and, for small constants, its value.
//!
//! A dimension is a monomial: a known factor times a product of named symbols (`batch`,
//! `2*seq`, `batch*seq`). That is enough for what shape arithmetic in real models does with
//! dynamic dimensions (Flatten, Reshape with `-1`, Concat along a dynamic axis), and equality
//! of two such dimensions is exact. A dimension nothing is known about is a fresh symbol that
//! equals no other (shown as `?`).

use crate::tensor::{DType, Tensor};
use std::fmt;
use std::sync::Arc;

/// One dimension: `factor * sym_1 * sym_2 * ...` (symbols sorted, repeated for powers).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DimFact {
    factor: u64,
    syms: Vec<Arc<str>>,
}

/// Symbols of unknown dimensions start with this character (never a valid ONNX dim_param
/// start in practice, and shown as `?`).
const UNKNOWN_PREFIX: char = '?';

impl DimFact {
    pub fn known(n: usize) -> DimFact {
        DimFact {
            factor: n as u64,
            syms: Vec::new(),
        }
    }

    /// A named dynamic dimension (`batch`).
    pub fn symbol(name: &str) -> DimFact {
        DimFact {
            factor: 1,
            syms: vec![Arc::from(name)],
        }
    }

    /// A dimension nothing is known about; `id` makes it distinct from every other.
    pub fn unknown(id: u64) -> DimFact {
        DimFact::symbol(&format!("{UNKNOWN_PREFIX}{id}"))
    }

    /// The `-1` of a shape tensor (Reshape's "infer this dim"), carried through shape
    /// arithmetic as a dims element so that `Concat(batch, -1)` still describes a target shape.
    pub fn infer_marker() -> DimFact {
        DimFact::symbol("#-1")
    }

    pub fn is_infer_marker(&self) -> bool {
        self.factor == 1 && self.syms.len() == 1 && &*self.syms[0] == "#-1"
    }

    /// The value, when the dimension is static.
    pub fn as_known(&self) -> Option<usize> {
        self.syms.is_empty().then_some(self.factor as usize)
    }

    pub fn is_known(&self) -> bool {
        self.syms.is_empty()
    }

    /// True when the dimension is exactly `n`.
    pub fn is(&self, n: usize) -> bool {
        self.as_known() == Some(n)
    }

    /// The symbols of this dimension (empty when static).
    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.syms.iter().map(|s| &**s)
    }

    pub fn mul(&self, other: &DimFact) -> DimFact {
        if self.is(0) || other.is(0) {
            return DimFact::known(0);
        }
        let mut syms: Vec<Arc<str>> = self.syms.iter().chain(&other.syms).cloned().collect();
        syms.sort();
        DimFact {
            factor: self.factor.saturating_mul(other.factor),
            syms,
        }
    }

    /// `self / other` when it divides exactly (as monomials); None otherwise.
    pub fn div(&self, other: &DimFact) -> Option<DimFact> {
        if other.factor == 0 || !self.factor.is_multiple_of(other.factor) {
            return None;
        }
        let mut syms = self.syms.clone();
        for s in &other.syms {
            let i = syms.iter().position(|x| x == s)?;
            syms.remove(i);
        }
        Some(DimFact {
            factor: self.factor / other.factor,
            syms,
        })
    }

    /// `self + other` when both are static, or equal monomials up to the factor.
    pub fn add(&self, other: &DimFact) -> Option<DimFact> {
        if self.syms == other.syms {
            return Some(DimFact {
                factor: self.factor + other.factor,
                syms: self.syms.clone(),
            });
        }
        if self.is(0) {
            return Some(other.clone());
        }
        if other.is(0) {
            return Some(self.clone());
        }
        None
    }

    /// Replaces every named symbol that `bind` resolves by its value.
    pub fn resolve(&self, bind: &dyn Fn(&str) -> Option<usize>) -> DimFact {
        let mut out = DimFact {
            factor: self.factor,
            syms: Vec::new(),
        };
        for s in &self.syms {
            match bind(s) {
                Some(v) => out.factor = out.factor.saturating_mul(v as u64),
                None => out.syms.push(s.clone()),
            }
        }
        if out.factor == 0 {
            out.syms.clear();
        }
        out
    }
}

impl fmt::Display for DimFact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.syms.is_empty() {
            return write!(f, "{}", self.factor);
        }
        let mut parts: Vec<String> = Vec::new();
        if self.factor != 1 {
            parts.push(self.factor.to_string());
        }
        for s in &self.syms {
            parts.push(if s.starts_with(UNKNOWN_PREFIX) {
                "?".to_string()
            } else {
                s.to_string()
            });
        }
        write!(f, "{}", parts.join("*"))
    }
}

/// A shape of dimension facts.
pub type ShapeFact = Vec<DimFact>;

/// Formats a shape fact as `[batch, 3, 224, 224]`.
pub fn fmt_shape_fact(s: &[DimFact]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// The static shape, when every dimension is known.
pub fn known_shape(s: &[DimFact]) -> Option<Vec<usize>> {
    s.iter().map(DimFact::as_known).collect()
}

pub fn shape_fact_of(s: &[usize]) -> ShapeFact {
    s.iter().map(|&d| DimFact::known(d)).collect()
}

/// What is known about one value.
#[derive(Clone, Debug, Default)]
pub struct Fact {
    pub dtype: Option<DType>,
    /// None: not even the rank is known.
    pub shape: Option<ShapeFact>,
    /// The value itself, for constants and values computed from constants.
    pub value: Option<Arc<Tensor>>,
    /// For a 1-D (or scalar) integer tensor that holds dimensions (what `Shape` returns on a
    /// value with symbolic dims): its elements as dimension facts.
    pub dims: Option<Vec<DimFact>>,
}

impl Fact {
    pub fn new(dtype: Option<DType>, shape: Option<ShapeFact>) -> Fact {
        Fact {
            dtype,
            shape,
            value: None,
            dims: None,
        }
    }

    pub fn typed(dtype: DType, shape: ShapeFact) -> Fact {
        Fact::new(Some(dtype), Some(shape))
    }

    /// The fact of a concrete tensor (its value kept).
    pub fn of_tensor(t: Arc<Tensor>) -> Fact {
        let dims = dims_of_value(&t);
        Fact {
            dtype: Some(t.dtype()),
            shape: Some(shape_fact_of(t.shape())),
            value: Some(t),
            dims,
        }
    }

    /// Only the type and shape of a concrete tensor.
    pub fn of_shape(t: &Tensor) -> Fact {
        Fact::typed(t.dtype(), shape_fact_of(t.shape()))
    }

    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(|s| s.len())
    }

    /// The static shape, when every dimension is known.
    pub fn known_shape(&self) -> Option<Vec<usize>> {
        self.shape.as_deref().and_then(known_shape)
    }

    /// The value as integers, when it is a known integer tensor.
    pub fn int_values(&self) -> Option<Vec<i64>> {
        let v = self.value.as_ref()?;
        if !v.dtype().is_int() {
            return None;
        }
        v.to_i64_vec()
    }

    /// The shape as text (`?` for an unknown rank).
    pub fn shape_string(&self) -> String {
        match &self.shape {
            Some(s) => fmt_shape_fact(s),
            None => "?".to_string(),
        }
    }
}

/// The dimension facts of a known 1-D or scalar integer tensor (non-negative elements only).
fn dims_of_value(t: &Tensor) -> Option<Vec<DimFact>> {
    if t.rank() > 1 || !t.dtype().is_int() || t.len() > 64 {
        return None;
    }
    let v = t.to_i64_vec()?;
    v.iter()
        .map(|&x| match x {
            -1 => Some(DimFact::infer_marker()),
            x if x >= 0 => Some(DimFact::known(x as usize)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monomial_arithmetic() {
        let b = DimFact::symbol("batch");
        let s = DimFact::symbol("seq");
        let bs = b.mul(&s).mul(&DimFact::known(4));
        assert_eq!(bs.to_string(), "4*batch*seq");
        assert_eq!(
            bs.div(&s.mul(&DimFact::known(2))).unwrap().to_string(),
            "2*batch"
        );
        assert!(bs.div(&DimFact::known(3)).is_none());
        assert!(b.div(&s).is_none());
        assert_eq!(b.mul(&DimFact::known(0)), DimFact::known(0));
        assert_eq!(b.add(&b).unwrap().to_string(), "2*batch");
        assert!(b.add(&s).is_none());
        assert_eq!(DimFact::unknown(3).to_string(), "?");
        assert_ne!(DimFact::unknown(3), DimFact::unknown(4));
        let r = bs.resolve(&|n| (n == "batch").then_some(2));
        assert_eq!(r.to_string(), "8*seq");
        assert_eq!(
            r.resolve(&|_| Some(5)).as_known(),
            Some(40),
            "resolving every symbol gives a static dim"
        );
    }

    #[test]
    fn constant_facts_carry_dims() {
        let t = Arc::new(Tensor::from_i64(vec![3], vec![1, 3, 224]));
        let f = Fact::of_tensor(t);
        assert_eq!(f.dims.as_ref().unwrap()[2], DimFact::known(224));
        assert_eq!(f.known_shape(), Some(vec![3]));
    }
}
