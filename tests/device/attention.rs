//! Memory-efficient attention (`CompileOptions::fused_attention`): `softmax(q·kᵀ·s + mask)·v`
//! in one kernel that stores neither scores nor probabilities. Checked against the CPU
//! reference on random inputs (ragged sequences, cross-attention, causal masks, batch and
//! head axes, f32 and f16 in both f16 forms), against the three-kernel attention, and for
//! what it saves; banded masks (the kernel stops at a causal band where the masked keys add
//! nothing, and walks them where they weigh); and the planner turning it on by itself under
//! a memory limit.

use crate::common::{devices, random, Domain, Rng};
use fusegraph::crates::reference::{assert_close, evaluate, tolerance};
use fusegraph::{
    CompileOptions, DType, Device, DeviceOptions, FusedAttention, Graph, GraphBuilder, HostTensor, NodeId,
    RuntimeError, Tensor,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One attention shape: `[batch, heads, seq_q, head]` queries against `seq_k` keys.
#[derive(Clone, Copy, Debug)]
struct Shape {
    batch: usize,
    heads: usize,
    seq_q: usize,
    seq_k: usize,
    head: usize,
    causal: bool,
    /// The logit of a masked position (with `causal`).
    masked: f64,
    dtype: DType,
}

/// The graph as `fusegraph-nn`'s attention writes it: keys transposed, scores scaled,
/// masked by an `iota` comparison (causal), softmax over the keys, times the values.
fn attention(s: Shape) -> (Graph, Vec<NodeId>, Vec<(String, HostTensor)>) {
    let mut rng = Rng::new((s.seq_q * 131 + s.seq_k * 7 + s.head) as u64);
    attention_with(s, &mut rng, |b, scores| {
        if !s.causal {
            return scores;
        }
        let row = b.iota(DType::I32, [s.seq_q, s.seq_k], 0).expect("iota");
        let col = b.iota(DType::I32, [s.seq_q, s.seq_k], 1).expect("iota");
        let masked = b.scalar(s.dtype, s.masked).expect("scalar");
        row.ge(&col).and_then(|m| m.select(&scores, &masked)).expect("mask")
    })
}

/// `softmax(mask(q·kᵀ/√head))·v` of shape `s` (its `causal` and `masked` unused: `mask`
/// makes the logits from the builder and the scaled scores), inputs drawn from `rng`.
fn attention_with(
    s: Shape,
    rng: &mut Rng,
    mask: impl FnOnce(&GraphBuilder, Tensor) -> Tensor,
) -> (Graph, Vec<NodeId>, Vec<(String, HostTensor)>) {
    let b = GraphBuilder::new();
    let mut feeds = Vec::new();
    let mut input = |name: &str, dims: [usize; 4]| -> Tensor {
        feeds.push((name.to_string(), random(rng, s.dtype, &dims, Domain::Any)));
        b.input(name, s.dtype, dims.to_vec()).expect("valid input")
    };
    let q = input("q", [s.batch, s.heads, s.seq_q, s.head]);
    let k = input("k", [s.batch, s.heads, s.seq_k, s.head]);
    let v = input("v", [s.batch, s.heads, s.seq_k, s.head]);
    let kt = k.transpose(&[0, 1, 3, 2]).expect("transpose");
    let scores = q.matmul(&kt).and_then(|t| t.mul_scalar(1.0 / (s.head as f64).sqrt())).expect("scores");
    let out = mask(&b, scores).softmax(3).and_then(|p| p.matmul(&v)).expect("attention");
    (b.graph(), vec![out.id()], feeds)
}

fn run(
    device: &Arc<Device>,
    g: &Graph,
    outs: &[NodeId],
    feeds: &[(String, HostTensor)],
    fused: bool,
) -> (Vec<HostTensor>, fusegraph::ExecutableStats) {
    let fused_attention = if fused { FusedAttention::Always } else { FusedAttention::Never };
    let opts = CompileOptions { fused_attention, ..Default::default() };
    let exe = device.compile(g, outs, &opts).expect("compiles");
    let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    (exe.run(&refs).expect("runs").into_vec(), exe.stats().clone())
}

/// [`devices`] with each form of the attention kernel: keys read one at a time by each
/// invocation, and blocks of keys staged in workgroup memory (`tiled_attention`).
fn attention_devices() -> Vec<(String, Arc<Device>)> {
    let mut out = Vec::new();
    for tiled in [false, true] {
        for (form, device) in devices() {
            let opts = DeviceOptions {
                f16_native: Some(device.f16_native()),
                tiled_attention: Some(tiled),
                ..Default::default()
            };
            let device = Arc::new(Device::new(&opts).expect("a device"));
            assert_eq!(device.tiled_attention(), tiled);
            out.push((format!("{form}, {}", if tiled { "tiled" } else { "one key at a time" }), device));
        }
    }
    out
}

#[test]
fn fused_attention_matches_the_reference_and_the_three_kernel_attention() {
    let f32s = |batch, heads, seq_q, seq_k, head, causal| Shape {
        batch,
        heads,
        seq_q,
        seq_k,
        head,
        causal,
        masked: -1e9,
        dtype: DType::F32,
    };
    let shapes = [
        f32s(1, 1, 7, 7, 8, true),
        f32s(2, 3, 33, 33, 16, true),
        f32s(1, 2, 5, 19, 12, false),
        f32s(1, 1, 64, 64, 64, true),
        f32s(1, 2, 1, 40, 8, false),
        // Two blocks of query rows per head, the last ragged; blocks of 28 keys (the tiled
        // kernel's workgroup memory holds 28 keys and values of 72), the last ragged.
        f32s(1, 2, 70, 45, 72, true),
        Shape { dtype: DType::F16, ..f32s(2, 2, 33, 33, 16, true) },
        Shape { dtype: DType::F16, ..f32s(1, 1, 9, 21, 6, false) },
        // Long enough that the tiled form's first workgroups stop at their band (64 rows,
        // blocks of 32 keys); with a masked logit of −1 the masked keys weigh, and both forms
        // must walk them all.
        f32s(1, 1, 200, 200, 8, true),
        Shape { masked: -1.0, ..f32s(1, 1, 200, 200, 8, true) },
        Shape { masked: -1.0, ..f32s(1, 2, 7, 7, 8, true) },
    ];
    let mut failures = Vec::new();
    for (form, device) in attention_devices() {
        for s in shapes {
            let (g, outs, feeds) = attention(s);
            let fmap: BTreeMap<String, HostTensor> = feeds.iter().cloned().collect();
            let want = evaluate(&g, &outs, &fmap, &BTreeMap::new()).expect("reference");
            let (got, stats) = run(&device, &g, &outs, &feeds, true);
            let (three, plain) = run(&device, &g, &outs, &feeds, false);
            // One attention kernel replaced the scores, softmax and product kernels.
            let fused_kernels = stats.kernels.iter().filter(|k| k.attention()).count();
            assert_eq!(
                fused_kernels,
                1,
                "{s:?} [{form}]: {:?}",
                stats.kernels.iter().map(|k| &k.label).collect::<Vec<_>>()
            );
            assert!(plain.kernels.iter().all(|k| !k.attention()));
            assert!(
                stats.kernels.len() < plain.kernels.len(),
                "{s:?}: {} vs {}",
                stats.kernels.len(),
                plain.kernels.len()
            );
            // The scores and probabilities are not in memory: the arena holds q, k, v and
            // the output only.
            let io: u64 = [s.seq_q, s.seq_k, s.seq_k, s.seq_q]
                .iter()
                .map(|&n| s.dtype.data_bytes(s.batch * s.heads * n * s.head) as u64)
                .sum();
            assert!(
                stats.lower_bound_bytes <= io + 4 * 256,
                "{s:?}: {} live bytes at the peak, inputs and output {io}",
                stats.lower_bound_bytes
            );
            let (rtol, atol) = tolerance(s.dtype);
            for (what, out) in [("reference", &want[0]), ("three kernels", &three[0])] {
                if let Err(e) = assert_close(&got[0], out, rtol, atol) {
                    failures.push(format!("{s:?} [{form}] against the {what}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Under a causal mask the keys past a row's band are never read: an infinite value at the
/// last key reaches no row that masks it (the three kernels, like the reference, give
/// `0 · ∞ = NaN` there), and those rows equal the reference with that value finite. The
/// tiled form stops per workgroup of 64 rows, so its last workgroup (rows 192–199, which
/// needs key 199's block for row 199) still reads it.
#[test]
fn keys_past_a_causal_band_are_not_read() {
    let s =
        Shape { batch: 1, heads: 1, seq_q: 200, seq_k: 200, head: 8, causal: true, masked: -1e9, dtype: DType::F32 };
    let (g, outs, mut feeds) = attention(s);
    let want = evaluate(&g, &outs, &feeds.iter().cloned().collect(), &BTreeMap::new()).expect("reference");
    let v = feeds.iter_mut().find(|(n, _)| n == "v").expect("v");
    let mut values = v.1.to_f64();
    values[199 * 8] = f64::INFINITY;
    v.1 = HostTensor::from_f64(DType::F32, v.1.shape().clone(), &values).expect("a tensor");
    let with_inf = evaluate(&g, &outs, &feeds.iter().cloned().collect(), &BTreeMap::new()).expect("reference");
    assert!(with_inf[0].to_f64()[0].is_nan(), "the reference multiplies the masked infinity by 0");
    let (rtol, atol) = tolerance(DType::F32);
    for (form, device) in attention_devices() {
        let (got, _) = run(&device, &g, &outs, &feeds, true);
        // The rows that skip key 199: the first `clean` rows of 8 values.
        let clean = if device.tiled_attention() { 192 } else { 199 } * 8;
        let rows = |t: &HostTensor| HostTensor::from_f64(DType::F32, [clean], &t.to_f64()[..clean]).expect("rows");
        assert_close(&rows(&got[0]), &rows(&want[0]), rtol, atol).unwrap_or_else(|e| panic!("[{form}]: {e}"));
    }
}

/// Random masks, bands and not: comparisons of the row `iota` (plus an offset) with the
/// column `iota` either way round, equal, a causal mask with a sliding window (`and`) or
/// with a prefix (`or`), negated or not, either branch masked, in i32 or f32, at
/// sizes constant folding makes a constant of (at most 4,096 elements) and sizes it leaves;
/// masked logits that vanish (−10⁹, −∞) and that weigh (−1, 2); one key or a few more keys
/// than queries. The fused attention (past 64 queries either form, at random) must match the reference
/// whatever `key_band` makes of the mask. `FUSEGRAPH_FUZZ_CASES=N` runs more (every 72nd
/// case repeats a combination with other sizes, offsets and values).
#[test]
fn random_masks_match_the_reference() {
    let cases: u64 = std::env::var("FUSEGRAPH_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(72);
    let forms: Vec<Arc<Device>> = [false, true]
        .map(|tiled| {
            let opts = DeviceOptions { tiled_attention: Some(tiled), ..Default::default() };
            Arc::new(Device::new(&opts).expect("a device"))
        })
        .into();
    let mut failures = Vec::new();
    for case in 0..cases {
        let mut rng = Rng::new(7_000 + case);
        let mut pick = |n: u64| (rng.next_u64() % n) as usize;
        // Every comparison, negated or not, either branch masked, at most 64 queries (a mask
        // folded to a constant where it has at most 4,096 elements) and past 64 (iota
        // comparisons, and more than one workgroup of the tiled form).
        let combo = case as usize % 72;
        let (cmp, negate, swap, large) = (combo % 9, combo / 9 % 2 == 1, combo / 18 % 2 == 1, combo / 36 == 1);
        let seq_q = if large { 65 + pick(40) } else { 1 + pick(64) };
        let seq_k = seq_q + [0, 0, 1, 3][pick(4)];
        let head = [4, 8][pick(2)];
        let offset = pick(6) as f64 - 2.0;
        let iota = [DType::I32, DType::F32][pick(2)];
        let masked = [-1e9, f64::NEG_INFINITY, -1e9, -1.0, 2.0][pick(5)];
        // The tiled form stops early only past its first workgroup of 64 queries.
        let device = &forms[if large { pick(2) } else { 0 }];
        let what = format!(
            "case {case}: {seq_q} queries, {seq_k} keys, head {head}, comparison {cmp} offset {offset} \
             negated {negate} swapped {swap} in {iota:?}, masked {masked} [tiled {}]",
            device.tiled_attention()
        );
        let shape = Shape { batch: 1, heads: 2, seq_q, seq_k, head, causal: false, masked, dtype: DType::F32 };
        let (g, outs, feeds) = attention_with(shape, &mut rng, |b, scores| {
            let row = b.iota(iota, [seq_q, seq_k], 0).and_then(|r| r.add_scalar(offset)).expect("row");
            let col = b.iota(iota, [seq_q, seq_k], 1).expect("col");
            let pred = match cmp {
                0 => row.ge(&col),
                1 => row.gt(&col),
                2 => col.le(&row),
                3 => col.lt(&row),
                // True past the band: a band where the masked logit is the true branch.
                4 => col.gt(&row),
                5 => row.lt(&col),
                // Only the diagonal, or all but it.
                6 => col.eq(&row),
                // Causal and a window of 5 keys; causal or one of the first 3 keys.
                7 => row.ge(&col).and_then(|p| p.and(&col.add_scalar(5.0)?.gt(&row)?)),
                _ => row.ge(&col).and_then(|p| p.or(&col.lt(&col.full_like(3.0)?)?)),
            }
            .and_then(|p| if negate { p.not() } else { Ok(p) })
            .expect("mask");
            let fill = b.scalar(DType::F32, masked).expect("masked");
            if swap { pred.select(&fill, &scores) } else { pred.select(&scores, &fill) }.expect("logits")
        });
        let fmap: BTreeMap<String, HostTensor> = feeds.iter().cloned().collect();
        let want = evaluate(&g, &outs, &fmap, &BTreeMap::new()).expect("reference");
        let (got, stats) = run(device, &g, &outs, &feeds, true);
        if !stats.kernels.iter().any(|k| k.attention()) {
            failures.push(format!("{what}: no attention kernel"));
        }
        let (rtol, atol) = tolerance(DType::F32);
        if let Err(e) = assert_close(&got[0], &want[0], rtol, atol) {
            failures.push(format!("{what}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// More workgroups than a grid dimension holds (65,535 on lavapipe): the runtime spreads
/// them over two dimensions (a padded grid), and every head past the first row of the grid
/// must still be computed (here 65,537 heads of one query row each, one workgroup per
/// head). The padding's workgroups leave at once; with robust buffer access their stores
/// would be dropped anyway, so that part is not observable here.
#[test]
fn tiled_attention_on_a_padded_grid() {
    let s =
        Shape { batch: 1, heads: 65_537, seq_q: 1, seq_k: 3, head: 2, causal: false, masked: -1e9, dtype: DType::F32 };
    let (g, outs, feeds) = attention(s);
    let opts = DeviceOptions { tiled_attention: Some(true), ..Default::default() };
    let device = Arc::new(Device::new(&opts).expect("a device"));
    let (got, stats) = run(&device, &g, &outs, &feeds, true);
    let kernel = stats.kernels.iter().find(|k| k.attention()).expect("an attention kernel");
    let [x, y, _] = kernel.workgroups;
    assert!(y > 1 && u64::from(x) * u64::from(y) > 65_537, "{:?}", kernel.workgroups);
    let fmap: BTreeMap<String, HostTensor> = feeds.iter().cloned().collect();
    let want = evaluate(&g, &outs, &fmap, &BTreeMap::new()).expect("reference");
    let (rtol, atol) = tolerance(DType::F32);
    assert_close(&got[0], &want[0], rtol, atol).expect("matches the reference");
}

/// A graph that only fits its memory limit with the attention fused: the planner turns it
/// on by itself (before rematerializing), the results stay right, and `Some(false)` gives
/// the typed out-of-memory error instead.
#[test]
fn memory_limit_turns_on_fused_attention() {
    let s =
        Shape { batch: 1, heads: 4, seq_q: 256, seq_k: 256, head: 16, causal: true, masked: -1e9, dtype: DType::F32 };
    let (g, outs, feeds) = attention(s);
    let device = Arc::new(Device::new(&DeviceOptions::default()).expect("a device"));
    let off = CompileOptions { fused_attention: FusedAttention::Never, ..Default::default() };
    let plain = device.plan(&g, &outs, &off).expect("plans");
    let fused = device
        .plan(&g, &outs, &CompileOptions { fused_attention: FusedAttention::Always, ..Default::default() })
        .expect("plans");
    // Scores and probabilities: 4 × 256 × 256 f32 each.
    assert!(
        plain.total_bytes >= fused.total_bytes + 4 * 256 * 256 * 4,
        "{} vs {}",
        plain.total_bytes,
        fused.total_bytes
    );
    let limit = (plain.total_bytes + fused.total_bytes) / 2;
    let err = device.compile(&g, &outs, &CompileOptions { memory_limit: Some(limit), ..off.clone() }).err();
    assert!(matches!(err, Some(RuntimeError::ResourceExhausted { .. })), "{err:?}");
    let exe =
        device.compile(&g, &outs, &CompileOptions { memory_limit: Some(limit), ..Default::default() }).expect("fits");
    assert!(exe.stats().kernels.iter().any(|k| k.attention()));
    let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let got = exe.run(&refs).expect("runs");
    let fmap: BTreeMap<String, HostTensor> = feeds.iter().cloned().collect();
    let want = evaluate(&g, &outs, &fmap, &BTreeMap::new()).expect("reference");
    let (rtol, atol) = tolerance(DType::F32);
    assert_close(&got[0], &want[0], rtol, atol).expect("matches the reference");
    // Without a limit the default keeps the three-kernel attention.
    let default = device.compile(&g, &outs, &CompileOptions::default()).expect("compiles");
    assert!(default.stats().kernels.iter().all(|k| !k.attention()));
}
