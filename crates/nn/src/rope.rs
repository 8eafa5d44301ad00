//! Rotary position embeddings: the frequencies of each scaling type as `transformers`
//! computes them (`RopeScaling`), the angles of run-time positions, and the rotation of q and
//! k — graph ops on the positions, elementwise work that fuses with its neighbours.

use crate::error::{unsupported, Result};
use fusegraph_ir::{DType, Tensor};
use serde_json::Value;

/// How rotary frequencies are scaled for contexts longer than the model was trained on.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `rope_type: default`: `inv_freq[i] = θ^(−2i/d)`.
    Default,
    /// `rope_type: linear`: every frequency divided by `factor`.
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// `rope_type: llama3` (Llama 3.1, 3.2): low frequencies divided by `factor`, high ones
    /// kept, the band between interpolated.
    Llama3 {
        /// The low frequencies' divisor.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are low.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are high.
        high_freq_factor: f64,
        /// The context length the model was trained on.
        original_max_position_embeddings: f64,
    },
    /// `rope_type: longrope` (Phi-3.5, Phi-4-mini; `su` before it): each frequency divided by
    /// a factor of its own — `short_factor` while a sequence is within
    /// `original_max_position_embeddings` positions, `long_factor` beyond — and the angles'
    /// cos and sin scaled by `attention_factor`.
    LongRope {
        /// The divisors within the trained context, one per frequency.
        short_factor: Vec<f64>,
        /// The divisors beyond it.
        long_factor: Vec<f64>,
        /// The context length the model was trained on.
        original_max_position_embeddings: usize,
        /// The cos and sin scale (`attention_factor`, else `√(1 + ln f / ln original)` for
        /// `f = factor`, else `max_position_embeddings / original`, where `f > 1`).
        attention_factor: f64,
    },
    /// `rope_type: yarn` (Qwen2.5's and Qwen3's long contexts): frequencies below a band
    /// divided by `factor`, those above kept, the band between blended by a linear ramp over
    /// the frequency index; the angles' cos and sin scaled by `attention_factor`.
    Yarn {
        /// The low frequencies' divisor (`factor`, else `max_position_embeddings / original`).
        factor: f64,
        /// The context length the model was trained on.
        original_max_position_embeddings: f64,
        /// The band's edges in rotations over the trained context (`beta_fast`: 32,
        /// `beta_slow`: 1).
        beta_fast: f64,
        /// See `beta_fast`.
        beta_slow: f64,
        /// Whether the band's edges are rounded outward to whole frequency indices (`truncate`).
        truncate: bool,
        /// The cos and sin scale (`attention_factor`, else `0.1 ln(factor) + 1`, or the ratio
        /// of that form at `mscale` and at `mscale_all_dim` where both are given).
        attention_factor: f64,
    },
}

/// YaRN's `mscale`: `0.1 · mscale · ln(scale) + 1`, 1 where `scale ≤ 1`.
pub(crate) fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl RopeScaling {
    /// `rope_scaling` (`transformers` 4) or `rope_parameters` (5): `rope_type` (or the older
    /// `type`) with its factors; `rope_parameters` may carry `rope_theta` too. The config's
    /// `max_position_embeddings` and top-level `original_max_position_embeddings` give
    /// longrope its context lengths where the parameters do not.
    pub(crate) fn parse(
        field: &str,
        v: Option<&Value>,
        max_position_embeddings: Option<usize>,
        original_max_position_embeddings: Option<usize>,
    ) -> Result<(RopeScaling, Option<f64>)> {
        let Some(v) = v.filter(|v| !v.is_null()) else { return Ok((RopeScaling::Default, None)) };
        let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(Value::as_str).unwrap_or("default");
        let theta = v.get("rope_theta").and_then(Value::as_f64);
        let num = |k: &str| -> Result<f64> {
            v.get(k).and_then(Value::as_f64).filter(|x| x.is_finite() && *x > 0.0).ok_or_else(|| {
                unsupported(&format!("{field}.{k}"), v.get(k).unwrap_or(&Value::Null), "a positive number")
            })
        };
        // The longest sequence and the context trained on (the parameters', else the config's
        // `original_max_position_embeddings`, else its longest sequence), for YaRN and longrope.
        let trained = || -> Result<(f64, f64)> {
            let max = max_position_embeddings.unwrap_or(0) as f64;
            let original = v
                .get("original_max_position_embeddings")
                .and_then(Value::as_f64)
                .or(original_max_position_embeddings.map(|o| o as f64))
                .unwrap_or(max);
            match original >= 2.0 {
                true => Ok((max, original)),
                false => Err(unsupported("original_max_position_embeddings", original, "at least 2 positions")),
            }
        };
        let scaling = match kind {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear { factor: num("factor")? },
            "llama3" => RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: num("original_max_position_embeddings")?,
            },
            "yarn" => {
                let (max, original) = trained()?;
                let factor = match v.get("factor") {
                    Some(_) => num("factor")?,
                    None => max / original,
                };
                let opt = |k: &str| v.get(k).and_then(Value::as_f64).filter(|x| *x != 0.0);
                let attention_factor = match (opt("attention_factor"), opt("mscale"), opt("mscale_all_dim")) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) => yarn_mscale(factor, m) / yarn_mscale(factor, all),
                    _ => yarn_mscale(factor, 1.0),
                };
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: opt("beta_fast").unwrap_or(32.0),
                    beta_slow: opt("beta_slow").unwrap_or(1.0),
                    truncate: v.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                    attention_factor,
                }
            }
            "longrope" | "su" => {
                let factors = |k: &str| -> Result<Vec<f64>> {
                    let list = v.get(k).and_then(Value::as_array).filter(|l| !l.is_empty());
                    let list = list.ok_or_else(|| {
                        unsupported(&format!("{field}.{k}"), v.get(k).unwrap_or(&Value::Null), "a list of numbers")
                    })?;
                    list.iter()
                        .map(|x| x.as_f64().filter(|x| x.is_finite() && *x > 0.0))
                        .collect::<Option<Vec<f64>>>()
                        .ok_or_else(|| {
                            unsupported(&format!("{field}.{k}"), Value::Array(list.clone()), "positive numbers")
                        })
                };
                let (max, original) = trained()?;
                let factor = v.get("factor").and_then(Value::as_f64).unwrap_or(max / original);
                let attention_factor = match v.get("attention_factor").and_then(Value::as_f64) {
                    Some(a) => a,
                    None if factor > 1.0 => (1.0 + factor.ln() / original.ln()).sqrt(),
                    None => 1.0,
                };
                RopeScaling::LongRope {
                    short_factor: factors("short_factor")?,
                    long_factor: factors("long_factor")?,
                    original_max_position_embeddings: original as usize,
                    attention_factor,
                }
            }
            other => {
                return Err(unsupported(
                    &format!("{field}.rope_type"),
                    other,
                    "default, linear, llama3, yarn or longrope",
                ))
            }
        };
        if let RopeScaling::Llama3 { low_freq_factor, high_freq_factor, .. } = scaling {
            // Equal factors (Llama 4's): no band between the low and the high frequencies.
            if high_freq_factor < low_freq_factor {
                return Err(unsupported(
                    &format!("{field}.high_freq_factor"),
                    high_freq_factor,
                    "a number at least low_freq_factor",
                ));
            }
        }
        Ok((scaling, theta))
    }

    /// The rotary frequencies of a head `dim` wide: `θ^(−2i/dim)` for `i < dim/2`, scaled
    /// (longrope's within the trained context), each rounded to f32 as `transformers` computes
    /// them.
    pub fn inv_freq(&self, theta: f64, dim: usize) -> Vec<f64> {
        (0..dim / 2)
            .map(|i| {
                let base = (1.0 / (theta as f32).powf((2 * i) as f32 / dim as f32)) as f64;
                let f = match self {
                    RopeScaling::Default => base,
                    RopeScaling::Linear { factor } => base / factor,
                    RopeScaling::LongRope { short_factor, .. } => return longrope_freq(theta, dim, i, short_factor[i]),
                    RopeScaling::Yarn {
                        factor,
                        original_max_position_embeddings,
                        beta_fast,
                        beta_slow,
                        truncate,
                        ..
                    } => {
                        let band = [*beta_fast, *beta_slow];
                        return yarn_freq(theta, dim, i, *factor, *original_max_position_embeddings, band, *truncate);
                    }
                    RopeScaling::Llama3 {
                        factor,
                        low_freq_factor,
                        high_freq_factor,
                        original_max_position_embeddings,
                    } => {
                        let (low_wavelen, high_wavelen) = (
                            original_max_position_embeddings / low_freq_factor,
                            original_max_position_embeddings / high_freq_factor,
                        );
                        let wavelen = 2.0 * std::f64::consts::PI / base;
                        if wavelen > low_wavelen {
                            base / factor
                        } else if wavelen < high_wavelen || high_freq_factor == low_freq_factor {
                            base
                        } else {
                            let smooth = (original_max_position_embeddings / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * base / factor + smooth * base
                        }
                    }
                };
                f as f32 as f64
            })
            .collect()
    }

    /// Longrope's frequencies beyond the trained context of a head `dim` wide, with that
    /// context's length in positions; `None` for the other types.
    pub fn long_inv_freq(&self, theta: f64, dim: usize) -> Option<(Vec<f64>, usize)> {
        let RopeScaling::LongRope { long_factor, original_max_position_embeddings, .. } = self else {
            return None;
        };
        let f = long_factor.iter().enumerate().map(|(i, &f)| longrope_freq(theta, dim, i, f)).collect();
        Some((f, *original_max_position_embeddings))
    }

    /// The scale of the rotary angles' cos and sin (longrope's and YaRN's attention factor,
    /// else 1).
    pub fn attention_factor(&self) -> f64 {
        match self {
            RopeScaling::LongRope { attention_factor, .. } | RopeScaling::Yarn { attention_factor, .. } => {
                *attention_factor
            }
            _ => 1.0,
        }
    }
}

/// YaRN's frequency `i` of a head `dim` wide, in f32 as `transformers` computes it: `factor`
/// over a trained context of `original` positions, the band between `beta_fast` and
/// `beta_slow` rotations (`[beta_fast, beta_slow]`) rounded outward where `truncate`.
fn yarn_freq(theta: f64, dim: usize, i: usize, factor: f64, original: f64, band: [f64; 2], truncate: bool) -> f64 {
    let [beta_fast, beta_slow] = band;
    // The frequency index at which a wave turns `rotations` times over the trained context.
    let index =
        |rotations: f64| (dim as f64 * (original / (rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln());
    let (low, high) = match truncate {
        true => (index(beta_fast).floor(), index(beta_slow).ceil()),
        false => (index(beta_fast), index(beta_slow)),
    };
    let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
    if low == high {
        high += 0.001;
    }
    let pos = (theta as f32).powf((2 * i) as f32 / dim as f32);
    let (extrapolated, interpolated) = (1.0 / pos, 1.0 / (factor as f32 * pos));
    let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
    let kept = 1.0 - ramp;
    (interpolated * (1.0 - kept) + extrapolated * kept) as f64
}

/// A longrope frequency, `1 / (factor · θ^(2i/dim))` in f32 as `transformers` computes it.
fn longrope_freq(theta: f64, dim: usize, i: usize, factor: f64) -> f64 {
    (1.0 / (factor as f32 * (theta as f32).powf((2 * i) as f32 / dim as f32))) as f64
}

/// `cos` and `sin` `[s, dh/2]` of the angles `positions · inv_freq` (`positions: i32 [s]`),
/// the product rounded to f32 as `transformers` forms it.
pub fn rotary_angles(positions: &Tensor, inv_freq: &[f64]) -> Result<(Tensor, Tensor)> {
    let (s, half) = (positions.dims()[0], inv_freq.len());
    let b = positions.builder();
    let p = positions.cast(DType::F32)?.broadcast_in_dim(vec![s, half], vec![0])?;
    let f = b.constant(DType::F32, [half], inv_freq)?.broadcast_in_dim(vec![s, half], vec![1])?;
    let angles = p.mul(&f)?;
    Ok((angles.cos()?, angles.sin()?))
}

/// The angles' `(cos, sin)` times `factor` (as they are where it is 1).
pub(crate) fn scaled((cos, sin): (Tensor, Tensor), factor: f64) -> Result<(Tensor, Tensor)> {
    if factor == 1.0 {
        return Ok((cos, sin));
    }
    Ok((cos.mul_scalar(factor)?, sin.mul_scalar(factor)?))
}

/// Rotates `x: [b, h, s, dh]` by per-position angles (`cos`, `sin`: `[s, r/2]`, or
/// `[b, s, r/2]` per sequence), pairing element `i` with `i + r/2` (`transformers`'
/// `rotate_half`) in each head's first `r` elements; the rest (where `r < dh`) pass unrotated.
pub fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rotate_as(x, cos, sin, false)
}

/// [`rotate`] with GPT-J's pairing: element `2i` with `2i + 1`, rotated by angle `i` (Ernie
/// 4.5's and GLM's `rotate_half` over interleaved cos and sin).
pub fn rotate_interleaved(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rotate_as(x, cos, sin, true)
}

fn rotate_as(x: &Tensor, cos: &Tensor, sin: &Tensor, interleaved: bool) -> Result<Tensor> {
    let (dh, half) = (x.dims()[3], *cos.dims().last().expect("angles of rank ≥ 2"));
    let b = x.builder();
    if 2 * half < dh {
        let rotated = rotate_as(&x.narrow(3, 0, 2 * half)?, cos, sin, interleaved)?;
        return Ok(b.concat(&[&rotated, &x.narrow(3, 2 * half, dh - 2 * half)?], 3)?);
    }
    let dims = [&x.dims()[..3], &[half]].concat();
    let (x1, x2) = match interleaved {
        true => {
            let pairs = x.reshape([&dims[..], &[2]].concat())?;
            (pairs.narrow(4, 0, 1)?.reshape(dims.clone())?, pairs.narrow(4, 1, 1)?.reshape(dims.clone())?)
        }
        false => (x.narrow(3, 0, half)?, x.narrow(3, half, half)?),
    };
    let map = if cos.rank() == 3 { vec![0, 2, 3] } else { vec![2, 3] };
    let (c, s) = (cos.broadcast_in_dim(dims.clone(), map.clone())?, sin.broadcast_in_dim(dims.clone(), map)?);
    let first = x1.mul(&c)?.sub(&x2.mul(&s)?)?;
    let second = x2.mul(&c)?.add(&x1.mul(&s)?)?;
    if !interleaved {
        return Ok(b.concat(&[&first, &second], 3)?);
    }
    let one = [&dims[..], &[1]].concat();
    let pairs = b.concat(&[&first.reshape(one.clone())?, &second.reshape(one)?], 4)?;
    Ok(pairs.reshape(x.dims().to_vec())?)
}
