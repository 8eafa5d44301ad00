//! Seeded parameter initializers and the generator behind them.

use crate::error::{config, Result};

/// How [`crate::Params`] fills a parameter that has no value yet.
///
/// The uniform variants draw from `U(-bound, bound)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Every element 0.
    Zeros,
    /// Every element 1.
    Ones,
    /// `U(-bound, bound)` with the given bound (finite, ≥ 0).
    Uniform(f64),
    /// PyTorch's default for `nn.Linear` / `nn.Conv2d` weights and biases
    /// (`kaiming_uniform_(a = √5)`): `U(-1/√fan_in, 1/√fan_in)`. `fan_in ≥ 1`.
    KaimingUniform {
        /// Inputs feeding each output (`in_dim`, or `c/groups · kh · kw`).
        fan_in: usize,
    },
    /// Glorot/Xavier uniform: `U(-b, b)` with `b = √(6 / (fan_in + fan_out))`.
    XavierUniform {
        /// Inputs feeding each output.
        fan_in: usize,
        /// Outputs each input feeds.
        fan_out: usize,
    },
    /// `N(0, std²)` (finite `std ≥ 0`), drawn with Box–Muller.
    Normal(f64),
    /// `U(lo, hi)` (finite, `lo ≤ hi`): batch norm's running variances, for instance.
    Between(f64, f64),
}

impl Init {
    /// Draws `n` values from `rng`; errors on a non-finite or negative scale or a zero fan.
    pub(crate) fn sample(&self, rng: &mut Rng, n: usize) -> Result<Vec<f64>> {
        let uniform = |rng: &mut Rng, bound: f64| -> Result<Vec<f64>> {
            if !bound.is_finite() || bound < 0.0 {
                return Err(config(format!("init: uniform bound {bound} must be finite and ≥ 0")));
            }
            Ok((0..n).map(|_| (2.0 * rng.next_f64() - 1.0) * bound).collect())
        };
        match *self {
            Init::Zeros => Ok(vec![0.0; n]),
            Init::Ones => Ok(vec![1.0; n]),
            Init::Uniform(bound) => uniform(rng, bound),
            Init::KaimingUniform { fan_in } => {
                if fan_in == 0 {
                    return Err(config("init: KaimingUniform needs fan_in ≥ 1"));
                }
                uniform(rng, 1.0 / (fan_in as f64).sqrt())
            }
            Init::XavierUniform { fan_in, fan_out } => {
                if fan_in + fan_out == 0 {
                    return Err(config("init: XavierUniform needs fan_in + fan_out ≥ 1"));
                }
                uniform(rng, (6.0 / (fan_in + fan_out) as f64).sqrt())
            }
            Init::Normal(std) => {
                if !std.is_finite() || std < 0.0 {
                    return Err(config(format!("init: normal std {std} must be finite and ≥ 0")));
                }
                Ok((0..n).map(|_| rng.normal() * std).collect())
            }
            Init::Between(lo, hi) => {
                if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
                    return Err(config(format!("init: Between({lo}, {hi}) needs finite lo ≤ hi")));
                }
                Ok((0..n).map(|_| lo + (hi - lo) * rng.next_f64()).collect())
            }
        }
    }
}

/// The seeded generator of initial values: PCG-64 (`rand_pcg::Pcg64Mcg`), whose output
/// rand specifies, so a seed gives the same values everywhere.
#[derive(Clone, Debug)]
pub(crate) struct Rng(rand_pcg::Pcg64Mcg);

impl Rng {
    /// A generator for `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Rng(rand::SeedableRng::seed_from_u64(seed))
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        rand::Rng::random(&mut self.0)
    }

    /// A standard normal sample.
    pub(crate) fn normal(&mut self) -> f64 {
        rand::Rng::sample(&mut self.0, rand_distr::StandardNormal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_bounded() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs = Init::KaimingUniform { fan_in: 4 }.sample(&mut a, 1000).unwrap();
        assert_eq!(xs, Init::KaimingUniform { fan_in: 4 }.sample(&mut b, 1000).unwrap());
        assert!(xs.iter().all(|&x| (-0.5..0.5).contains(&x)));
        assert_ne!(xs, Init::KaimingUniform { fan_in: 4 }.sample(&mut Rng::new(8), 1000).unwrap());
        let n = Init::Normal(2.0).sample(&mut a, 20000).unwrap();
        let mean = n.iter().sum::<f64>() / n.len() as f64;
        let var = n.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n.len() as f64;
        assert!(mean.abs() < 0.1 && (var.sqrt() - 2.0).abs() < 0.1, "mean {mean} var {var}");
    }

    #[test]
    fn bad_scales_are_errors() {
        let mut r = Rng::new(0);
        assert!(Init::KaimingUniform { fan_in: 0 }.sample(&mut r, 1).is_err());
        assert!(Init::XavierUniform { fan_in: 0, fan_out: 0 }.sample(&mut r, 1).is_err());
        assert!(Init::Uniform(f64::NAN).sample(&mut r, 1).is_err());
        assert!(Init::Normal(-1.0).sample(&mut r, 1).is_err());
    }
}
