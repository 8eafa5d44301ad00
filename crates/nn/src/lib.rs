//! fusegraph's layer library.
//!
//! Layers record their parameters and ops into a [`fusegraph_ir::GraphBuilder`] through
//! [`fusegraph_ir::Tensor`] handles; their parameter values live on the host in [`Params`],
//! created by seeded initializers ([`Init`]) and saved to / loaded from safetensors files.
//! [`models`] builds small whole models (an MLP classifier, a ResNet, a GPT-2 style
//! transformer) from the layers.
//!
//! ```
//! use fusegraph_ir::{DType, GraphBuilder, HostTensor};
//! use fusegraph_nn::{Linear, Params};
//! use std::collections::BTreeMap;
//!
//! let b = GraphBuilder::new();
//! let mut params = Params::new(42);
//! let x = b.input("x", DType::F32, [4, 3])?;
//! let y = Linear::new(&b, &mut params, "fc", 3, 2, true)?.forward(&x)?.relu()?;
//! assert_eq!(y.dims(), &[4, 2]);
//! assert_eq!(params.num_elements(), 3 * 2 + 2);
//!
//! let feeds = BTreeMap::from([("x".to_string(), HostTensor::new([4, 3], vec![0.5f32; 12])?)]);
//! let out = fusegraph_reference::evaluate(&b.graph(), &[y.id()], &feeds, params.as_map()).unwrap();
//! assert_eq!(out[0].shape().dims(), &[4, 2]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Invariants: parameters are f32 for now ([`Params::parameter`] takes a dtype so mixed
//! precision can come later); a given seed and build order always give the same values; no
//! constructor or `forward` panics on user input — bad configurations return [`NnError`].

#![warn(missing_docs)]

mod attention;
mod blocks;
mod error;
mod init;
mod layers;
pub mod models;
pub mod optim;
mod params;

pub use attention::MultiHeadAttention;
pub use blocks::{Mlp, ResidualBlock, TransformerBlock};
pub use error::{NnError, Result};
pub use init::Init;
pub use layers::{Activation, BatchNorm2d, Conv2d, Embedding, LayerNorm, Linear, RmsNorm};
pub use optim::{Adam, Optimizer, Sgd};
pub use params::Params;
