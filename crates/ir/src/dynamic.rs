//! Slices at a position known only at run time: [`Tensor::dynamic_slice`] and
//! [`Tensor::dynamic_update_slice`] (a decode step's position embedding and its KV-cache
//! write).
//!
//! A dynamic slice is a composite — a gather of `len` consecutive indices from the clamped
//! start — so the reference, lowering, fusion and autodiff of those primitives are its own. A
//! dynamic update slice is a primitive, [`Op::DynamicUpdateSlice`]: out of place it is a loop
//! kernel's element function (the update inside the window, the operand elsewhere); where
//! the memory plan writes its result over its operand (a cache parameter updated in place)
//! the kernel writes the window alone, which a composite of `select` over the whole operand
//! could not.

use crate::{DType, IrError, Op, Result, Tensor};

fn err(op: &str, detail: String) -> IrError {
    IrError::Type { op: op.into(), detail }
}

impl Tensor {
    /// The start of a window of `len` along an axis of `dim`: `start` (a rank-0 i32 or u32)
    /// clamped to `[0, dim − len]`, as i32.
    fn clamped_start(&self, op: &str, start: &Tensor, dim: usize, len: usize) -> Result<Tensor> {
        if start.rank() != 0 || !start.dtype().is_int() {
            return Err(err(op, format!("start {} must be a rank-0 i32 or u32", start.ty())));
        }
        let b = self.builder();
        let s = if start.dtype() == DType::I32 { start.clone() } else { start.cast(DType::I32)? };
        s.maximum(&b.scalar(DType::I32, 0.0)?)?.minimum(&b.scalar(DType::I32, (dim - len) as f64)?)
    }

    /// Elements `[s, s + len)` along `axis`, where `s` is `start` (a rank-0 i32 or u32 known at
    /// run time) clamped to `[0, dim − len]` so the window fits, as XLA's `DynamicSlice`.
    /// Result: `self`'s type with `len` along `axis`. Errors: an axis out of range, `len` of 0
    /// or past the axis, a start that is not a rank-0 integer.
    pub fn dynamic_slice(&self, start: &Tensor, axis: usize, len: usize) -> Result<Tensor> {
        const OP: &str = "dynamic_slice";
        let Some(&dim) = self.dims().get(axis) else {
            return Err(err(OP, format!("axis {axis} out of range for {}", self.ty())));
        };
        if len == 0 || len > dim {
            return Err(err(OP, format!("length {len} along axis {axis} of {} must be in 1..={dim}", self.ty())));
        }
        let s = self.clamped_start(OP, start, dim, len)?;
        let idx = self.builder().iota(DType::I32, [len], 0)?.add(&s)?;
        self.gather(&idx, axis)
    }

    /// `self` with `update` written at `[s, s + len)` along `axis` (`len` = `update`'s size
    /// there), where `s` is `start` (a rank-0 i32 or u32 known at run time) clamped to
    /// `[0, dim − len]`, as XLA's `DynamicUpdateSlice` ([`Op::DynamicUpdateSlice`]). `update`
    /// has `self`'s dtype and shape but along `axis`. A `start` of shape `[dims[0]]` (for an
    /// `axis` past 0) starts each index of axis 0 at its own position. Result: `self`'s type.
    pub fn dynamic_update_slice(&self, update: &Tensor, start: &Tensor, axis: usize) -> Result<Tensor> {
        self.op(Op::DynamicUpdateSlice { axis }, &[update, start])
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, GraphBuilder, IrError};

    #[test]
    fn types_and_errors() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [2, 8, 3]).unwrap();
        let pos = b.input("pos", DType::I32, Vec::<usize>::new()).unwrap();
        assert_eq!(x.dynamic_slice(&pos, 1, 4).unwrap().dims(), &[2, 4, 3]);
        let u = b.input("u", DType::F32, [2, 1, 3]).unwrap();
        assert_eq!(x.dynamic_update_slice(&u, &pos, 1).unwrap().ty(), x.ty());
        let msg = |r: crate::Result<crate::Tensor>| match r {
            Err(IrError::Type { op, detail }) => format!("{op}: {detail}"),
            other => panic!("expected a type error, got {other:?}"),
        };
        assert!(msg(x.dynamic_slice(&pos, 3, 1)).contains("axis 3 out of range"));
        assert!(msg(x.dynamic_slice(&pos, 1, 9)).contains("1..=8"));
        let fpos = b.input("f", DType::F32, Vec::<usize>::new()).unwrap();
        assert!(msg(x.dynamic_slice(&fpos, 1, 2)).contains("rank-0 i32 or u32"));
        let wrong = b.input("w", DType::F32, [2, 1, 4]).unwrap();
        assert!(msg(x.dynamic_update_slice(&wrong, &pos, 1)).starts_with("dynamic_update_slice: update f32[2,1,4]"));
        assert!(msg(x.dynamic_update_slice(&u, &fpos, 1)).contains("start f32[] must be a rank-0 i32 or u32"));
    }

    #[test]
    fn the_update_is_one_op_that_prints_and_parses() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [2, 8, 3]).unwrap();
        let u = b.input("u", DType::F32, [2, 2, 3]).unwrap();
        let pos = b.input("pos", DType::U32, Vec::<usize>::new()).unwrap();
        let y = x.dynamic_update_slice(&u, &pos, 1).unwrap();
        let g = b.graph();
        assert_eq!(g.node(y.id()).op, crate::Op::DynamicUpdateSlice { axis: 1 });
        let text = crate::text::print(&g);
        assert!(text.contains("dynamic_update_slice(%0, %1, %2) {axis=1} : f32[2,8,3]"), "{text}");
        assert_eq!(crate::text::print(&crate::text::parse(&text).unwrap()), text);
    }
}
