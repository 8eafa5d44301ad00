//! The README's example: a model written as a struct of layers, trained for a few steps on
//! the device, then evaluated at another batch size from the same parameters, and checked
//! against the CPU reference. `cargo run --release --example quickstart`

use clap::Parser;
use fusegraph::nn::{cross_entropy, module, Adam, Forward, Linear, Params, Scope};
use fusegraph::train::{build_step, Objective, TrainOptions, Trainer};
use fusegraph::{DType, Device, GraphBuilder, HostTensor, Jit, Tensor};

/// A classifier: 4 features → 16 hidden (ReLU) → 3 classes.
struct Classifier {
    hidden: Linear,
    out: Linear,
}

module!(Classifier { hidden, out });

impl Classifier {
    fn new(s: &Scope) -> fusegraph::Result<Self> {
        Ok(Classifier {
            hidden: Linear::new(&s.at("hidden"), 4, 16, true)?,
            out: Linear::new(&s.at("out"), 16, 3, true)?,
        })
    }
}

impl Forward for Classifier {
    fn forward(&self, x: &Tensor) -> fusegraph::nn::Result<Tensor> {
        self.out.forward(&self.hidden.forward(x)?.relu()?)
    }
}

/// The README's example: a model as a struct of layers, trained, evaluated at another batch
/// size from the same parameters. Takes no options.
#[derive(Parser)]
struct Args {}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    Args::parse();
    fusegraph::init_logging();
    let model = Classifier::new(&Scope::root())?;
    let mut params = Params::of(&model, 0)?; // seeded: hidden.weight, hidden.bias, out.…

    // One training step, recorded once: forward, cross-entropy, backward and Adam.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [8, 4])?;
    let y = b.input("y", DType::I32, [8])?;
    let logits = model.forward(&x)?;
    let loss = cross_entropy(&logits, &y)?;
    let objective = Objective { output: logits, loss, segments: vec![] };
    let step = build_step(&b, &mut params, &objective, &Adam::new(0.05), &TrainOptions::default())?;
    let mut trainer = Trainer::new(&Device::shared()?, step, &params)?;
    let xv = HostTensor::new([8, 4], (0..32).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect())?;
    let yv = HostTensor::new([8], (0..8).map(|i| i % 3).collect())?;
    let first = trainer.step(&[("x", &xv), ("y", &yv)])?.loss;
    let mut last = first;
    for _ in 0..30 {
        last = trainer.step(&[("x", &xv), ("y", &yv)])?.loss;
    }
    println!("loss     {first:.4} → {last:.4} after 31 steps");

    // Evaluation at batch 3: compiled for that shape, bound to the trained weights in the
    // trainer's store (no copy).
    let eval = Jit::new(trainer.store(), Default::default(), |_, x| Ok(vec![model.forward(&x[0])?.softmax(1)?]));
    let x3 = HostTensor::new([3, 4], xv.to_f64()[..12].iter().map(|&v| v as f32).collect())?;
    let probs = eval.run(&[("x", &x3)])?.remove(0);

    // The same model on the CPU reference, with the store's current weights.
    let rb = GraphBuilder::new();
    let rx = rb.input("x", DType::F32, [3, 4])?;
    let ry = model.forward(&rx)?.softmax(1)?;
    let feeds = [("x".to_string(), x3)].into();
    let want = fusegraph::crates::reference::evaluate(&rb.graph(), &[ry.id()], &feeds, &trainer.store().read_all()?)?;
    fusegraph::crates::reference::assert_close(&probs, &want[0], 1e-4, 1e-6)?;

    println!("device   {}", Device::shared()?.describe());
    println!("kernels  {} per training step", trainer.executable().stats().kernels.len());
    println!(
        "row 0    {:?} (classes of the first sample; its label is 0)",
        probs.as_slice::<f32>().unwrap_or(&[]).get(..3)
    );
    println!("matches the CPU reference");
    assert!(last < first, "training lowers the loss");
    Ok(())
}
