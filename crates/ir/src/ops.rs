//! Arithmetic operators on tensor handles: `&a + &b`, `&a * 2.0`, `2.0 * &a`, `-&a`, on
//! references and owned handles alike. Each records the op as the method of that name does
//! ([`Tensor::add`], …; a scalar operand as [`Tensor::add_scalar`] takes it) and
//! returns its [`Result`]: shapes and dtypes are checked when the op is recorded, so
//! `(&a + &b)?` reads as `a.add(&b)?`.

use crate::{Result, Tensor};
use std::ops::{Add, Div, Mul, Neg, Sub};

/// `lhs OP rhs` for two tensors, by reference or by value.
macro_rules! tensor_op {
    ($trait:ident, $method:ident) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(&self, rhs)
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(&self, &rhs)
            }
        }
    };
}

tensor_op!(Add, add);
tensor_op!(Sub, sub);
tensor_op!(Mul, mul);
tensor_op!(Div, div);

/// `tensor OP scalar` and `scalar OP tensor`: the scalar a rank-0 tensor of the tensor's dtype,
/// broadcast (`&a * 2.0` records what `a.mul_scalar(2.0)` records).
macro_rules! scalar_op {
    ($trait:ident, $method:ident) => {
        impl $trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: f64) -> Result<Tensor> {
                Tensor::$method(self, &self.scalar_like(rhs)?)
            }
        }
        impl $trait<f64> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: f64) -> Result<Tensor> {
                Tensor::$method(&self, &self.scalar_like(rhs)?)
            }
        }
        impl $trait<&Tensor> for f64 {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(&rhs.scalar_like(self)?, rhs)
            }
        }
        impl $trait<Tensor> for f64 {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(&rhs.scalar_like(self)?, &rhs)
            }
        }
    };
}

scalar_op!(Add, add);
scalar_op!(Sub, sub);
scalar_op!(Mul, mul);
scalar_op!(Div, div);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}

#[cfg(test)]
mod tests {
    use crate::{text, DType, GraphBuilder, IrError};

    /// Each operator records what its method records: the same graph text.
    #[test]
    fn operators_record_what_their_methods_record() {
        let ops = GraphBuilder::new();
        let (a, b) = (ops.input("a", DType::F32, [2, 3]).unwrap(), ops.input("b", DType::F32, [3]).unwrap());
        let y = (&a + &b).unwrap();
        let y = (&y * 2.0).unwrap();
        let y = (0.5 - y).unwrap();
        let y = (y / &a).unwrap();
        let _ = (-(y - a.clone()).unwrap()).unwrap();
        let calls = GraphBuilder::new();
        let (a, b) = (calls.input("a", DType::F32, [2, 3]).unwrap(), calls.input("b", DType::F32, [3]).unwrap());
        let y = a.add(&b).unwrap();
        let y = y.mul_scalar(2.0).unwrap();
        let y = y.scalar_like(0.5).unwrap().sub(&y).unwrap();
        let y = y.div(&a).unwrap();
        let _ = y.sub(&a).unwrap().neg().unwrap();
        assert_eq!(text::print(&ops.graph()), text::print(&calls.graph()));
    }

    /// A bad operand is the typed error the method gives, not a panic.
    #[test]
    fn operators_give_the_methods_typed_errors() {
        let b = GraphBuilder::new();
        let (x, y) = (b.input("x", DType::F32, [2, 3]).unwrap(), b.input("y", DType::F32, [4]).unwrap());
        let err = (&x + &y).unwrap_err();
        assert!(matches!(err, IrError::Type { .. }), "{err}");
        assert!(err.to_string().contains("do not broadcast"), "{err}");
        let i = b.input("i", DType::I32, [2]).unwrap();
        assert!((&i * 0.5).is_err(), "0.5 is no i32");
    }
}
