//! A mixture of experts' shape from a `config.json`: each class's fields and `transformers`'
//! defaults where a field is left out.

use super::{Architecture, RawConfig};
use crate::error::{unsupported, Result};
use crate::feed_forward::{MoeConfig, MoeStyle, Router, SharedExpert};

/// The mixture of experts of a config of a class with mixtures (`transformers`' defaults
/// where a field is left out), `None` for the other classes or no experts.
pub(super) fn mixture(arch: Architecture, raw: &RawConfig, layers: usize) -> Result<Option<MoeConfig>> {
    // (experts, top k, normalized, the experts' width field) by class.
    let (experts, top_k, normalize, width) = match arch {
        Architecture::Mixtral => (8, 2, Some(true), raw.intermediate_size),
        Architecture::Qwen2Moe => (60, 4, None, raw.moe_intermediate_size),
        Architecture::Qwen3Moe => (128, 8, None, raw.moe_intermediate_size),
        Architecture::Olmoe => (64, 8, None, raw.intermediate_size),
        Architecture::GptOss => (128, 4, Some(true), raw.intermediate_size),
        Architecture::Glm4Moe => (128, 8, None, raw.moe_intermediate_size),
        Architecture::Ernie45Moe => (64, 6, Some(true), raw.moe_intermediate_size),
        Architecture::GraniteMoe => (8, 2, Some(true), raw.intermediate_size),
        Architecture::DeepseekV2 => (64, 6, Some(false), raw.moe_intermediate_size.or(Some(1407))),
        Architecture::DeepseekV3 => (256, 8, None, raw.moe_intermediate_size.or(Some(2048))),
        Architecture::MiniMaxM2 => (256, 8, Some(true), raw.intermediate_size),
        Architecture::Glm4MoeLite => (64, 4, None, raw.moe_intermediate_size.or(Some(1536))),
        Architecture::Llama4 => (16, 1, Some(false), raw.intermediate_size.or(Some(8192))),
        _ => return Ok(None),
    };
    // `transformers` 5 writes `num_local_experts` for every class; the hub's configs
    // `num_experts` for all but Mixtral.
    let experts =
        raw.num_experts.or(raw.num_local_experts).or(raw.n_routed_experts).or(raw.moe_num_experts).unwrap_or(experts);
    if experts == 0 {
        return Ok(None);
    }
    let top_k = raw.num_experts_per_tok.or(raw.moe_k).unwrap_or(top_k);
    if top_k == 0 || top_k > experts {
        return Err(unsupported("num_experts_per_tok", top_k, &format!("1 to the {experts} experts")));
    }
    let expert_size = width
        .filter(|&w| w > 0)
        .ok_or_else(|| unsupported("moe_intermediate_size", "(missing or 0)", "a positive integer"))?;
    let step = raw.decoder_sparse_step.unwrap_or(1);
    // Dense layers: `mlp_only_layers`, or GLM's first `first_k_dense_replace`.
    let mut dense = raw.mlp_only_layers.clone().unwrap_or_default();
    let first_dense = match arch {
        Architecture::Glm4Moe | Architecture::Glm4MoeLite => 1,
        Architecture::DeepseekV3 => 3,
        _ => 0,
    };
    match (&raw.mlp_layer_types, arch) {
        // GLM-4.7-Flash's list of `dense` and `sparse` layers.
        (Some(types), Architecture::Glm4MoeLite) => {
            if types.len() != layers || types.iter().any(|t| t != "dense" && t != "sparse") {
                let want = format!("{layers} entries (num_hidden_layers), each dense or sparse");
                return Err(unsupported("mlp_layer_types", format!("{types:?}"), &want));
            }
            dense.extend(types.iter().enumerate().filter(|(_, t)| *t == "dense").map(|(i, _)| i));
        }
        _ => dense.extend(0..raw.first_k_dense_replace.unwrap_or(first_dense)),
    }
    // ERNIE 4.5's: mixtures on every `moe_layer_interval`-th layer from the start index to the end.
    let (step, dense, field) = match arch {
        Architecture::Ernie45Moe => {
            let start = raw.moe_layer_start_index.unwrap_or(1);
            let end = match raw.moe_layer_end_index.unwrap_or(-1) {
                -1 => layers.saturating_sub(1),
                e => usize::try_from(e).map_err(|_| unsupported("moe_layer_end_index", e, "-1 or a layer"))?,
            };
            let dense = (0..layers).filter(|&i| i < start || i > end).collect();
            (raw.moe_layer_interval.unwrap_or(1), dense, "moe_layer_interval")
        }
        // Llama 4's: its `moe_layers`, else every `interleave_moe_layer_step`-th layer.
        Architecture::Llama4 => {
            let step = raw.interleave_moe_layer_step.unwrap_or(1);
            let sparse: Vec<usize> = match &raw.moe_layers {
                Some(l) => l.clone(),
                None => (step.max(1) - 1..layers).step_by(step.max(1)).collect(),
            };
            (
                if step == 0 { 0 } else { 1 },
                (0..layers).filter(|i| !sparse.contains(i)).collect(),
                "interleave_moe_layer_step",
            )
        }
        _ => (step, dense, "decoder_sparse_step"),
    };
    if step == 0 {
        return Err(unsupported(field, 0, "a positive integer"));
    }
    let shared_expert = match arch {
        Architecture::Qwen2Moe => Some(raw.shared_expert_intermediate_size.unwrap_or(5632)).filter(|&w| w > 0),
        Architecture::Glm4Moe | Architecture::DeepseekV3 | Architecture::Glm4MoeLite => {
            Some(expert_size * raw.n_shared_experts.unwrap_or(1)).filter(|&w| w > 0)
        }
        Architecture::DeepseekV2 => Some(expert_size * raw.n_shared_experts.unwrap_or(2)).filter(|&w| w > 0),
        Architecture::Llama4 => Some(expert_size),
        Architecture::Ernie45Moe => Some(expert_size * raw.moe_num_shared_experts.unwrap_or(2)).filter(|&w| w > 0),
        _ => None,
    };
    let gated = arch == Architecture::Qwen2Moe;
    let shared_bias = match arch {
        Architecture::Ernie45Moe => raw.use_bias == Some(true),
        Architecture::DeepseekV2 => raw.mlp_bias == Some(true),
        _ => false,
    };
    // `n_group` and `topk_group`, `transformers`' defaults where left out.
    let groups = |(groups, top_groups): (usize, usize)| -> Result<(usize, usize)> {
        let (groups, top_groups) = (raw.n_group.unwrap_or(groups), raw.topk_group.unwrap_or(top_groups));
        if groups == 0 || experts % groups != 0 || top_groups == 0 || top_groups > groups {
            let want = format!("n_group dividing the {experts} experts, topk_group 1 to n_group");
            return Err(unsupported("n_group", format!("{groups} (topk_group {top_groups})"), &want));
        }
        if top_k > top_groups * (experts / groups) {
            return Err(unsupported("num_experts_per_tok", top_k, "at most the experts of topk_group groups"));
        }
        Ok((groups, top_groups))
    };
    let router = match arch {
        Architecture::Glm4Moe | Architecture::DeepseekV3 | Architecture::MiniMaxM2 | Architecture::Glm4MoeLite => {
            let (groups, top_groups) = groups(if arch == Architecture::DeepseekV3 { (8, 4) } else { (1, 1) })?;
            let scale = raw.routed_scaling_factor.unwrap_or(match arch {
                Architecture::DeepseekV3 => 2.5,
                Architecture::Glm4MoeLite => 1.8,
                _ => 1.0,
            });
            Router::Sigmoid { groups, top_groups, scale }
        }
        Architecture::DeepseekV2 => {
            let (groups, top_groups) = match raw.topk_method.as_deref() {
                None | Some("greedy") => (1, 1),
                Some("group_limited_greedy") => groups((1, 1))?,
                Some(other) => return Err(unsupported("topk_method", other, "greedy or group_limited_greedy")),
            };
            Router::SoftmaxGroups { groups, top_groups, scale: raw.routed_scaling_factor.unwrap_or(1.0) }
        }
        Architecture::Ernie45Moe => Router::Softmax { corrected: true },
        Architecture::Llama4 => Router::TopLogits,
        _ => Router::Softmax { corrected: false },
    };
    Ok(Some(MoeConfig {
        experts,
        top_k,
        expert_size,
        normalize: normalize
            .or(raw.norm_topk_prob)
            .unwrap_or(matches!(arch, Architecture::Glm4Moe | Architecture::DeepseekV3 | Architecture::Glm4MoeLite)),
        shared_expert: shared_expert.map(|width| SharedExpert { width, gated, bias: shared_bias }),
        router,
        sparse_layers: (0..layers).map(|i| (i + 1) % step == 0 && !dense.contains(&i)).collect(),
        style: match arch {
            Architecture::GraniteMoe => MoeStyle::Halves,
            Architecture::Llama4 => MoeStyle::Llama4,
            Architecture::GptOss => {
                MoeStyle::GptOss { alpha: raw.swiglu_alpha.unwrap_or(1.702), limit: raw.swiglu_limit.unwrap_or(7.0) }
            }
            _ => MoeStyle::Standard,
        },
    }))
}
