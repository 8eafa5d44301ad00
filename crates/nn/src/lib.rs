//! fusegraph's layer library: modules, layers, blocks, small models and optimizers.
//!
//! A model is a [`Module`]: a struct of layers whose parameters ([`Param`]) are named by their
//! place in the tree (`h.0.attn.q.weight`, from the [`Scope`]s passed down at construction).
//! A module holds no graph and no values: `forward` records its ops into the input's graph, so
//! one model records into any number of graphs (training, evaluation at another batch size,
//! generation). Values live on the host in [`Params`] (seeded) or on a device in a runtime's
//! parameter store.
//!
//! ```
//! use fusegraph_ir::{DType, GraphBuilder, HostTensor};
//! use fusegraph_nn::{Forward, Linear, Module, Params, Scope};
//! use std::collections::BTreeMap;
//!
//! let fc = Linear::new(&Scope::root().at("fc"), 3, 2, true)?;
//! let params = Params::of(&fc, 42)?; // fc.weight, fc.bias
//! assert_eq!(params.num_elements(), fc.num_elements());
//!
//! let b = GraphBuilder::new();
//! let x = b.input("x", DType::F32, [4, 3])?;
//! let y = fc.forward(&x)?.relu()?;
//! assert_eq!(y.dims(), &[4, 2]);
//! let feeds = BTreeMap::from([("x".to_string(), HostTensor::new([4, 3], vec![0.5f32; 12])?)]);
//! let out = fusegraph_reference::evaluate(&b.graph(), &[y.id()], &feeds, params.as_map()).unwrap();
//! assert_eq!(out[0].shape().dims(), &[4, 2]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Invariants: modules are plain data (`Send + Sync`); a given seed and module always give
//! the same values; no constructor or `forward` panics on user input — bad configurations
//! return [`NnError`] naming the layer's path.

#![warn(missing_docs)]

mod attention;
mod blocks;
pub mod causal;
pub mod checkpoint;
mod error;
pub mod feed_forward;
pub mod gguf;
pub mod gpt2;
mod init;
pub mod latent;
mod layers;
pub mod llama;
pub mod llama_config;
pub mod loss;
pub mod models;
mod module;
pub mod optim;
mod params;
pub mod pretrained;
pub mod rope;

pub use attention::MultiHeadAttention;
pub use blocks::{Mlp, ResidualBlock, TransformerBlock};
pub use causal::{CacheShape, CausalLm};
pub use checkpoint::{Checkpoint, KeyMap, Quantize};
pub use error::{NnError, Result};
pub use gpt2::{Gpt2, Gpt2Config};
pub use init::Init;
pub use layers::{Activation, BatchNorm2d, Conv2d, Conv2dConfig, Embedding, LayerNorm, Linear, RmsNorm};
pub use llama::{Llama, LlamaConfig};
pub use loss::{cross_entropy, mse};
pub use models::{Gpt, GptConfig, MlpClassifier, ResNet, TorchvisionResNet};
pub use module::{Forward, Matrices, Module, Param, Scope, Sequential};
pub use optim::{Adam, Optimizer, Sgd};
pub use params::Params;
pub use pretrained::Pretrained;
