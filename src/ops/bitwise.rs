//! Bitwise ops on integer tensors (opset 18): BitwiseAnd, BitwiseOr, BitwiseXor with NumPy
//! broadcasting, and BitwiseNot. Exact in every precision plan: they never see a float.

use super::shape::{broadcast_like_first, same_as_input};
use super::util::{broadcast_binary, input};
use super::{InputRole, OpCtx, OpError, OpResult, Registry};
use crate::tensor::{Tensor, TensorData};

pub fn register(r: &mut Registry) {
    r.add("BitwiseAnd", |_, i| binary(i, "BitwiseAnd"))
        .infer(broadcast_like_first)
        .roles(&[InputRole::Data, InputRole::Data]);
    r.add("BitwiseOr", |_, i| binary(i, "BitwiseOr"))
        .infer(broadcast_like_first)
        .roles(&[InputRole::Data, InputRole::Data]);
    r.add("BitwiseXor", |_, i| binary(i, "BitwiseXor"))
        .infer(broadcast_like_first)
        .roles(&[InputRole::Data, InputRole::Data]);
    r.add("BitwiseNot", not).infer(same_as_input);
}

fn binary(inputs: &[Option<&Tensor>], op: &str) -> OpResult {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    use TensorData as TD;
    macro_rules! ints {
        ($($v:ident),*) => {
            match (a.data(), b.data()) {
                $((TD::$v(x), TD::$v(y)) => {
                    let (shape, out) = match op {
                        "BitwiseAnd" => broadcast_binary(x, a.shape(), y, b.shape(), |p, q| p & q)?,
                        "BitwiseOr" => broadcast_binary(x, a.shape(), y, b.shape(), |p, q| p | q)?,
                        _ => broadcast_binary(x, a.shape(), y, b.shape(), |p, q| p ^ q)?,
                    };
                    Ok(vec![Tensor::from_parts(shape, TD::$v(out.into()))])
                })*
                _ => Err(OpError(format!(
                    "{op} needs two integer tensors of one type, got {:?} and {:?}",
                    a.dtype(),
                    b.dtype()
                ))),
            }
        };
    }
    ints!(I8, U8, I16, U16, I32, U32, I64, U64)
}

fn not(_: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    use TensorData as TD;
    macro_rules! ints {
        ($($v:ident),*) => {
            match x.data() {
                $(TD::$v(v) => TD::$v(v.iter().map(|&e| !e).collect::<Vec<_>>().into()),)*
                _ => {
                    return Err(OpError(format!(
                        "BitwiseNot needs an integer tensor, got {:?}",
                        x.dtype()
                    )))
                }
            }
        };
    }
    let out = ints!(I8, U8, I16, U16, I32, U32, I64, U64);
    Ok(vec![Tensor::from_parts(x.shape().to_vec(), out)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitwise_ops_broadcast_and_refuse_floats() {
        let a = Tensor::from_i64(vec![2, 2], vec![0b1100, 0b1010, -1, 0]);
        let b = Tensor::from_i64(vec![2], vec![0b1010, 0b0110]);
        let and = binary(&[Some(&a), Some(&b)], "BitwiseAnd").unwrap();
        assert_eq!(
            and[0].to_i64_vec().unwrap(),
            vec![0b1000, 0b0010, 0b1010, 0]
        );
        let xor = binary(&[Some(&a), Some(&b)], "BitwiseXor").unwrap();
        assert_eq!(
            xor[0].to_i64_vec().unwrap(),
            vec![0b0110, 0b1100, !0b1010, 0b0110]
        );
        let n = crate::graph::Node::default();
        let not_a = not(&OpCtx::new(&n, 18), &[Some(&a)]).unwrap();
        assert_eq!(
            not_a[0].to_i64_vec().unwrap(),
            vec![!0b1100, !0b1010, 0, -1]
        );
        let f = Tensor::from_f32(vec![1], vec![1.0]);
        assert!(binary(&[Some(&f), Some(&f)], "BitwiseOr").is_err());
    }
}
