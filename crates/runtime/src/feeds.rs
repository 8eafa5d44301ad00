//! Feeding inputs and reading outputs by tensor handle: [`FeedName`] and [`Outputs`].

use crate::{Result, RuntimeError};
use fusegraph_ir::{HostTensor, NodeId, Op, Tensor};
use std::borrow::Cow;

/// What names a feed of [`crate::Executable::run`]: an input's name (`"x"`), or the
/// [`Tensor`] handle the input was recorded as (`&x`).
pub trait FeedName {
    /// The input's name; for a handle that is not an input, [`RuntimeError::NotAnInput`].
    fn feed_name(&self) -> Result<Cow<'_, str>>;
}

impl FeedName for &str {
    fn feed_name(&self) -> Result<Cow<'_, str>> {
        Ok(Cow::Borrowed(self))
    }
}

impl FeedName for String {
    fn feed_name(&self) -> Result<Cow<'_, str>> {
        Ok(Cow::Borrowed(self))
    }
}

impl FeedName for &String {
    fn feed_name(&self) -> Result<Cow<'_, str>> {
        Ok(Cow::Borrowed(self))
    }
}

impl FeedName for &Tensor {
    fn feed_name(&self) -> Result<Cow<'_, str>> {
        let op = self.builder().edit(|g| g.node(self.id()).op.clone());
        match op {
            Op::Input { name } => Ok(Cow::Owned(name)),
            other => {
                Err(RuntimeError::NotAnInput { node: format!("{} {}", self.id(), other.name()), ty: self.ty().clone() })
            }
        }
    }
}

impl FeedName for Tensor {
    fn feed_name(&self) -> Result<Cow<'_, str>> {
        (&self).feed_name().map(|n| Cow::Owned(n.into_owned()))
    }
}

/// The outputs of a run, in the order they were given to `compile`: a slice of
/// [`HostTensor`]s (`out[0]`), also found by the handle of the tensor they are the value of
/// ([`Outputs::value`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Outputs {
    values: Vec<HostTensor>,
    nodes: Vec<NodeId>,
}

impl Outputs {
    pub(crate) fn new(values: Vec<HostTensor>, nodes: Vec<NodeId>) -> Self {
        Outputs { values, nodes }
    }

    /// The value of output `t` (a handle to a node passed to `compile` as an output), if it
    /// is one.
    pub fn value(&self, t: &Tensor) -> Option<&HostTensor> {
        self.nodes.iter().position(|&n| n == t.id()).map(|i| &self.values[i])
    }

    /// Takes output `i` out, shifting the later ones down (as `Vec::remove`; panics past the
    /// end).
    pub fn remove(&mut self, i: usize) -> HostTensor {
        self.nodes.remove(i);
        self.values.remove(i)
    }

    /// Takes the last output out.
    pub fn pop(&mut self) -> Option<HostTensor> {
        self.nodes.pop();
        self.values.pop()
    }

    /// The values, in order.
    pub fn into_vec(self) -> Vec<HostTensor> {
        self.values
    }
}

impl std::ops::Deref for Outputs {
    type Target = [HostTensor];
    fn deref(&self) -> &[HostTensor] {
        &self.values
    }
}

impl IntoIterator for Outputs {
    type Item = HostTensor;
    type IntoIter = std::vec::IntoIter<HostTensor>;
    fn into_iter(self) -> Self::IntoIter {
        self.values.into_iter()
    }
}

impl<'a> IntoIterator for &'a Outputs {
    type Item = &'a HostTensor;
    type IntoIter = std::slice::Iter<'a, HostTensor>;
    fn into_iter(self) -> Self::IntoIter {
        self.values.iter()
    }
}

impl From<Outputs> for Vec<HostTensor> {
    fn from(o: Outputs) -> Self {
        o.values
    }
}
