//! The tiling of a workgroup-tiled matmul ([`MatmulTiling`]): workgroup grid, register block
//! and `k` slice; the candidates the autotuner times and the default per shape.

/// The shape of a tiling: a `gx`×`gy` grid of invocations, each computing a `bm`×`bn` block
/// (multiples of 4) of the workgroup's `gy·bm`×`gx·bn` output tile, stepping over `k` by `tk`.
/// [`MatmulTiling::CANDIDATES`] are the tilings an autotuner chooses among;
/// [`MatmulTiling::default_for`] is the choice without measuring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MatmulTiling {
    /// Invocations along the output's columns.
    pub gx: usize,
    /// Invocations along the output's rows.
    pub gy: usize,
    /// Rows of each invocation's block.
    pub bm: usize,
    /// Columns of each invocation's block.
    pub bn: usize,
    /// The `k` slice staged in workgroup memory per step.
    pub tk: usize,
}

/// 64×64 tiles, 4×4 per invocation: 2 × 64 × 32 × 4 bytes = 16 KiB of workgroup storage,
/// WebGPU's default limit.
pub(crate) const SMALL: MatmulTiling = MatmulTiling { gx: 16, gy: 16, bm: 4, bn: 4, tk: 32 };

/// 128×128 tiles, 8×8 per invocation (2 × 128 × 16 × 4 bytes = 16 KiB): half the workgroup
/// loads per multiply-add of [`SMALL`]; about 1.5× faster on lavapipe at 1024³, where every
/// workgroup-memory load is a loop over the SIMD lanes.
pub(crate) const LARGE: MatmulTiling = MatmulTiling { gx: 16, gy: 16, bm: 8, bn: 8, tk: 16 };

/// 128×128 tiles, 16×16 per invocation by 64 invocations: twice [`LARGE`]'s multiply-adds
/// per workgroup-memory load. 256 accumulators would spill on a GPU; on a CPU adapter, where
/// an accumulator is a SIMD register or a stack slot and each workgroup-memory load a loop
/// over the lanes, it measured 1.1–1.6× [`LARGE`] on lavapipe (1024³ and the transformer's
/// 256×768×3072). Not a default: lavapipe takes about 2 s to compile it (0.4 s for
/// [`LARGE`]), which only a long run pays back; the autotuner decides.
pub(crate) const CPU_LARGE: MatmulTiling = MatmulTiling { gx: 8, gy: 8, bm: 16, bn: 16, tk: 16 };

/// 16×64 tiles, 4×4 per invocation by 64 invocations: for products of at most 16 rows (a
/// batch of a few vectors through a layer), where [`SMALL`]'s 64 rows would be mostly
/// padding. On lavapipe through the tiled kernel, `[8, 768]·[768, 3072]` and
/// `[1, 768]·[768, 3072]`: 27 ms against 75 ms for [`SMALL`] (medians of 7, in turn).
pub(crate) const FEW_ROWS: MatmulTiling = MatmulTiling { gx: 16, gy: 4, bm: 4, bn: 4, tk: 32 };

/// The default tiling of the cooperative-matrix kernel: 64×64 tiles by 128 invocations, 32
/// deep (see [`CoopPlan`]).
pub(crate) const COOP: MatmulTiling = MatmulTiling { gx: 16, gy: 8, bm: 8, bn: 4, tk: 32 };

/// 128×128 tiles by 256 invocations, 32 deep: with 32-lane subgroups each owns 4×2
/// fragments (6 fragment loads per 8 multiply-adds, against 4 per 4 for [`COOP`]), and the
/// operands are loaded from device memory half as often per multiply-add. Its operand tiles
/// (16 KiB of f16) exceed the plain kernel's 16 KiB of f32 staging, so it is a cooperative
/// tiling only.
pub(crate) const COOP_LARGE: MatmulTiling = MatmulTiling { gx: 16, gy: 16, bm: 8, bn: 8, tk: 32 };

/// [`COOP`] and [`COOP_LARGE`] 64 deep: half the barriers and staging rounds per
/// multiply-add, for twice the operand tiles (24 and 48 KiB in all with 32-lane subgroups).
pub(crate) const COOP_DEEP: MatmulTiling = MatmulTiling { tk: 64, ..COOP };

pub(crate) const COOP_LARGE_DEEP: MatmulTiling = MatmulTiling { tk: 64, ..COOP_LARGE };

/// The side of a cooperative matrix the kernel uses (`coop_mat16x16`).
pub(crate) const COOP_SIDE: usize = 16;

impl MatmulTiling {
    /// The tilings an autotuner times: `SMALL` and `LARGE`; 64×64 tiles of 8×8 blocks
    /// by 64 invocations; 64×128 tiles by 128 invocations; 32×32 tiles of 4×4 blocks with a
    /// 64-deep `k` slice (small matrices, batched attention); 16×64 tiles (few rows); and
    /// for CPU adapters, blocks of 256 and 512 outputs per invocation: `CPU_LARGE`, 64×128
    /// tiles of 16×32 blocks, 128×128 tiles of 32×16 blocks 8 deep (on lavapipe these won 21
    /// of the 27 shape classes the test suite and benchmarks tuned, but take 2–4.5 s each to
    /// compile).
    pub const CANDIDATES: [MatmulTiling; 10] = [
        SMALL,
        LARGE,
        MatmulTiling { gx: 8, gy: 8, bm: 8, bn: 8, tk: 32 },
        MatmulTiling { gx: 16, gy: 8, bm: 8, bn: 8, tk: 16 },
        MatmulTiling { gx: 8, gy: 8, bm: 4, bn: 4, tk: 64 },
        FEW_ROWS,
        CPU_LARGE,
        MatmulTiling { gx: 4, gy: 4, bm: 16, bn: 32, tk: 16 },
        MatmulTiling { gx: 8, gy: 4, bm: 32, bn: 16, tk: 8 },
        // 32×32 tiles by 64 invocations: for products whose output is small beside a GPU
        // (a transformer's 256×768 projections are 12 tiles of 128×128 on an H100's 132
        // multiprocessors; 192 of these).
        MatmulTiling { gx: 8, gy: 8, bm: 4, bn: 4, tk: 32 },
    ];

    /// The tilings of the cooperative-matrix kernel ([`CoopPlan`](crate::CoopPlan)), the default first. A
    /// tiling from this list, forced or tuned, selects that kernel for an f16 product that can
    /// run on cooperative matrices (and the plain kernel with its default tiling for any
    /// other product when the tiling is not [`is_valid`](Self::is_valid) for it); no
    /// plain-kernel candidate is in the list, so a tuned choice says which kernel won.
    pub const COOP_CANDIDATES: [MatmulTiling; 4] = [COOP, COOP_LARGE, COOP_DEEP, COOP_LARGE_DEEP];

    /// Whether this is one of [`COOP_CANDIDATES`](Self::COOP_CANDIDATES).
    pub fn is_cooperative(&self) -> bool {
        Self::COOP_CANDIDATES.contains(self)
    }

    /// The untuned choice: `LARGE` where both `m` and `n` fill its tiles, `FEW_ROWS`
    /// for at most 16 rows, else `SMALL` (less padding).
    pub fn default_for(m: usize, n: usize) -> MatmulTiling {
        if m >= 128 && n >= 128 {
            LARGE
        } else if m <= 16 {
            FEW_ROWS
        } else {
            SMALL
        }
    }

    /// Rows × columns of the workgroup's output tile.
    pub fn tile(&self) -> (usize, usize) {
        (self.gy * self.bm, self.gx * self.bn)
    }

    /// Whether the lowering can use it: vec4 blocks, at most 256 invocations, every
    /// invocation loading the same number of vec4s of each tile, and both tiles within
    /// WebGPU's default 16 KiB of workgroup storage.
    pub fn is_valid(&self) -> bool {
        let (tm, tn) = self.tile();
        let wgs = self.gx * self.gy;
        self.bm.is_multiple_of(4)
            && self.bn.is_multiple_of(4)
            && self.bm > 0
            && self.bn > 0
            && self.tk > 0
            && (1..=256).contains(&wgs)
            && (tm * self.tk / 4).is_multiple_of(wgs)
            && (self.tk * tn / 4).is_multiple_of(wgs)
            && (tm + tn) * self.tk * 4 <= 16384
    }
}

impl std::fmt::Display for MatmulTiling {
    /// `gx×gy/bm×bn/tk`, e.g. `16x16/8x8/16`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}/{}x{}/{}", self.gx, self.gy, self.bm, self.bn, self.tk)
    }
}

impl std::str::FromStr for MatmulTiling {
    type Err = String;

    /// Parses the [`Display`](std::fmt::Display) form; rejects tilings that are not
    /// [`MatmulTiling::is_valid`].
    fn from_str(s: &str) -> Result<Self, String> {
        let v: Vec<usize> =
            s.split(['x', '/']).map(|t| t.trim().parse::<usize>()).collect::<Result<_, _>>().map_err(|e| {
                format!("matmul tiling `{s}`: {e} (expected gx x gy / bm x bn / tk, such as 16x16/8x8/16)")
            })?;
        let [gx, gy, bm, bn, tk] = v[..] else {
            return Err(format!("matmul tiling `{s}`: expected five numbers gx x gy / bm x bn / tk"));
        };
        let t = MatmulTiling { gx, gy, bm, bn, tk };
        if !t.is_valid() && !t.is_cooperative() {
            return Err(format!("matmul tiling `{s}` is not usable (vec4 blocks, ≤ 256 invocations, ≤ 16 KiB)"));
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn candidate_tilings_fit_the_loops_and_webgpu_limits() {
        for t in MatmulTiling::CANDIDATES {
            assert!(t.is_valid(), "{t}");
            assert_eq!(t.to_string().parse::<MatmulTiling>(), Ok(t));
        }
        assert_eq!(MatmulTiling::default_for(128, 128), LARGE);
        assert_eq!(MatmulTiling::default_for(127, 1000), SMALL);
        assert_eq!(MatmulTiling::default_for(16, 1000), FEW_ROWS);
        assert_eq!(MatmulTiling::default_for(1, 3072), FEW_ROWS);
        assert!(FEW_ROWS.is_valid() && FEW_ROWS.tile() == (16, 64));
        // 6 × 4 blocks are not whole vec4s; 32 × 32 invocations are too many; 128×128 tiles
        // 128 deep need 128 KiB.
        for bad in ["16x16/6x4/16", "32x32/4x4/16", "16x16/8x8/128", "16x16/8x8", "a"] {
            assert!(bad.parse::<MatmulTiling>().is_err(), "{bad}");
        }
        // The cooperative tilings: none is a plain candidate (a tuned choice says which
        // kernel won), each parses back, its staging loops divide evenly, its `k` steps are
        // whole fragments, and an invocation's epilogue block lies within one fragment row.
        for t in MatmulTiling::COOP_CANDIDATES {
            assert!(t.is_cooperative() && !MatmulTiling::CANDIDATES.contains(&t), "{t}");
            assert_eq!(t.to_string().parse::<MatmulTiling>(), Ok(t));
            let (tm, tn) = t.tile();
            let wgs = t.gx * t.gy;
            assert!((tm * t.tk / 4).is_multiple_of(wgs) && (t.tk * tn / 4).is_multiple_of(wgs), "{t}");
            assert!(t.tk.is_multiple_of(COOP_SIDE) && COOP_SIDE.is_multiple_of(t.bm), "{t}");
            assert!(tm.is_multiple_of(COOP_SIDE) && tn.is_multiple_of(COOP_SIDE) && t.bn.is_multiple_of(4), "{t}");
        }
        assert_eq!(MatmulTiling::COOP_CANDIDATES[0], COOP, "the default first");
    }
}
