//! The workgroup-tiled, register-blocked matmul kernel (`tiled_main`): operands staged
//! through workgroup memory one `k` slice ahead, the fused prologue and epilogue through the
//! element functions.

use crate::matmul::*;
use crate::matmul_coop::*;
use crate::options::{Binding, LowerOptions, Strategy};
use crate::region::write_region;
use crate::storage::{packed_halves, storage_elem, store_value};
use crate::tiling::*;
use crate::view::strided_view;
use crate::writer::{unravel, vty};
use fusegraph_ir::{Graph, NodeId, Op};
use fusegraph_passes::Kernel;
use std::fmt::Write;

/// Writes `eO_acc` and the workgroup tiles into `body` and returns `main` and the number of
/// workgroups (one per output tile per batch entry).
#[allow(clippy::too_many_arguments)]
pub fn tiled_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    plan: &TiledPlan,
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
    strategy: &Strategy,
    coop: Option<CoopPlan>,
    inv: &Invariants,
    body: &mut String,
) -> (String, u64) {
    let TiledPlan { matmul: mm, output, vec4_lhs, vec4_rhs } = *plan;
    let binding = |node: NodeId| bindings.iter().position(|b| b.node == node && !b.output).expect("a bound operand");
    let region = &regions.iter().find(|(o, _)| *o == output).expect("the output has a region").1;
    write_region(g, output, region, Some(mm), &inv.params(), body);

    let ops = g.operands(mm);
    let conv = matches!(g.node(mm).op, Op::Conv2d { .. });
    // A convolution is an implicit GEMM: the weights [o, c·kh·kw] times the image patches
    // [c·kh·kw, oh·ow] of each image, patches gathered on the fly by `fg_im2col`.
    let (lhs, rhs) = if conv { (ops[1], ops[0]) } else { (ops[0], ops[1]) };
    let (batch, m, n, k) = gemm_dims(g, mm);
    let (ld, rd) = (g.ty(lhs).shape.dims(), g.ty(rhs).shape.dims());
    let dims = g.ty(mm).shape.dims();
    let rank = dims.len();
    let MatmulTiling { gx, gy, bm, bn, tk } = match coop {
        Some(cp) => cp.tiling,
        None => strategy.matmul_tiling.filter(MatmulTiling::is_valid).unwrap_or(MatmulTiling::default_for(m, n)),
    };
    let (tm, tn, wgs) = (gy * bm, gx * bn, gx * gy);
    let groups = ColumnGroups { gx, per: bn / 4, blocked: strategy.blocked_columns };
    let (tiles_m, tiles_n) = (m.div_ceil(tm), n.div_ceil(tn));
    let workgroups = (batch * tiles_m * tiles_n) as u64;
    let t = vty(g.ty(mm).dtype);
    let (k_out, out_b) = bindings.iter().enumerate().find(|(_, b)| b.output).expect("one output");
    let out_dt = g.ty(out_b.node).dtype;
    let vec4_store = tiled_vec4_store(g, plan, opts);

    // Tiles of vec4s: fg_tile_a[kk * tm/4 + q] holds rows 4q..4q+3 of the lhs tile at `kk`,
    // fg_tile_b[kk * tn/4 + q] columns 4q..4q+3 of the rhs tile (one load per 4 values).
    // Cooperative matrices load from scalar f16 arrays, both tiles row-major: the lhs tile
    // (stride tk) so that the invocations of a subgroup, which load adjacent `k` of one
    // row, store adjacent halves (column-major put their stores tm halves apart, all in one
    // bank; row-major made the kernel 1.3× faster at 1024³ on an H100), the rhs tile
    // (stride tn).
    if let Some(cp) = coop {
        let _ = writeln!(body, "var<workgroup> fg_tile_a: array<f16, {}>;", tk * tm);
        let _ = writeln!(body, "var<workgroup> fg_tile_b: array<f16, {}>;", tk * tn);
        let _ = writeln!(body, "var<workgroup> fg_tile_c: array<f32, {}>;\n", cp.band_rows() * tn);
        if let Some(size) = cp.emulated {
            body.push_str(&CoopPlan::emulation(size));
        }
    } else {
        let _ = writeln!(body, "var<workgroup> fg_tile_a: array<vec4<{t}>, {}>;", tk * tm / 4);
        let _ = writeln!(body, "var<workgroup> fg_tile_b: array<vec4<{t}>, {}>;\n", tk * tn / 4);
    }

    let mut s = String::new();
    let w = line;
    let extra_args = match coop {
        Some(CoopPlan { emulated: None, .. }) => ", @builtin(subgroup_id) sg_id: u32",
        _ => "",
    };
    s.push_str(&tile_head(wgs, extra_args, workgroups, tiles_m, tiles_n));
    let bc = if conv {
        write_im2col(g, mm, body);
        w(&mut s, 1, "let a_base = 0u;".into());
        Vec::new()
    } else {
        let bc = unravel(&mut s, &dims[..rank - 2], "bt", "bc");
        for (name, od, size) in [("a_base", ld, m * k), ("b_base", rd, k * n)] {
            w(&mut s, 1, format!("let {name} = {};", operand_base(&bc, od, size)));
        }
        bc
    };
    w(&mut s, 1, format!("let o_base = bt * {}u;", m * n));
    w(&mut s, 1, format!("let row0 = tile_row * {tm}u;"));
    w(&mut s, 1, format!("let col0 = tile_col * {tn}u;"));
    w(&mut s, 1, format!("let tx = lid % {gx}u;"));
    w(&mut s, 1, format!("let ty = lid / {gx}u;"));
    if let Some(cp) = coop {
        let (br, bc) = cp.blocks();
        if let Some(size) = cp.emulated {
            w(&mut s, 1, format!("let sg_id = lid / {size}u;"));
            w(&mut s, 1, format!("let sg_lane = lid % {size}u;"));
        }
        w(&mut s, 1, format!("let sg_row = (sg_id / {}u) * {}u;", cp.cols, br * COOP_SIDE));
        w(&mut s, 1, format!("let sg_col = (sg_id % {}u) * {}u;", cp.cols, bc * COOP_SIDE));
        for i in 0..br {
            for j in 0..bc {
                w(&mut s, 1, format!("var fg_c{i}_{j} = {};", cp.zero()));
            }
        }
    } else {
        for r in 0..bm {
            for p in 0..bn / 4 {
                w(&mut s, 1, format!("var acc{r}_{p} = vec4<{t}>();"));
            }
        }
    }
    // Operands read from their bindings as vec4s (`vec4_lhs`, `vec4_rhs`) are loaded into
    // registers one `k` slice ahead: the loads of the next slice are in flight
    // while this one is multiplied.
    let prefetch = ((vec4_lhs.is_some() || vec4_rhs.is_some()) && tk.is_multiple_of(4)).then(|| Prefetch {
        lhs: vec4_lhs.map(|v| Staged::of(g, kernel, lhs, v, true, &bc, binding(v.leaf))),
        rhs: vec4_rhs.map(|v| Staged::of(g, kernel, rhs, v, false, &bc, binding(v.leaf))),
        dims: (m, n, k),
        tile: (tm, tn, tk),
        wgs,
        elem: storage_elem(g.ty(lhs).dtype, opts),
        tile_elem: if coop.is_some() { "f16" } else { t },
        coop: coop.is_some(),
    });
    if let Some(p) = &prefetch {
        p.load(&mut s, "0u", true);
    }
    w(&mut s, 1, format!("for (var k0 = 0u; k0 < {k}u; k0 = k0 + {tk}u) {{"));
    // Load phase: prefetched operands store their registers; any other operand is loaded
    // four values of a column of the lhs tile (or a row of the rhs tile) per invocation
    // through its operand function, and stored as one vec4 (as f16 halves for cooperative
    // matrices).
    let (lv, rv) = (format!("v{}", lhs.index()), format!("v{}", rhs.index()));
    if let Some(p) = prefetch.as_ref().filter(|p| p.lhs.is_some()) {
        p.store(&mut s, true);
    } else {
        w(&mut s, 2, format!("for (var l = 0u; l < {}u; l = l + 1u) {{", tm * tk / 4 / wgs));
        w(&mut s, 3, format!("let e = l * {wgs}u + lid;"));
        w(&mut s, 3, format!("let r = row0 + (e / {tk}u) * 4u;"));
        w(&mut s, 3, format!("let kk = e % {tk}u;"));
        w(&mut s, 3, "let gk = k0 + kk;".into());
        w(&mut s, 3, format!("var x = vec4<{t}>();"));
        w(&mut s, 3, format!("if (gk < {k}u) {{"));
        for (q, comp) in XYZW.iter().enumerate() {
            w(&mut s, 4, format!("if (r + {q}u < {m}u) {{ x.{comp} = {lv}(a_base + (r + {q}u) * {k}u + gk); }}"));
        }
        w(&mut s, 3, "}".into());
        if coop.is_some() {
            w(&mut s, 3, format!("let ia = (e / {tk}u) * {}u + kk;", 4 * tk));
            for (q, comp) in XYZW.iter().enumerate() {
                w(&mut s, 3, format!("fg_tile_a[ia + {}u] = f16(x.{comp});", q * tk));
            }
        } else {
            w(&mut s, 3, format!("fg_tile_a[kk * {}u + e / {tk}u] = x;", tm / 4));
        }
        w(&mut s, 2, "}".into());
    }
    if let Some(p) = prefetch.as_ref().filter(|p| p.rhs.is_some()) {
        p.store(&mut s, false);
    } else {
        w(&mut s, 2, format!("for (var l = 0u; l < {}u; l = l + 1u) {{", tk * tn / 4 / wgs));
        w(&mut s, 3, format!("let e = l * {wgs}u + lid;"));
        w(&mut s, 3, format!("let gk = k0 + e / {}u;", tn / 4));
        w(&mut s, 3, format!("let c = col0 + (e % {}u) * 4u;", tn / 4));
        w(&mut s, 3, format!("var x = vec4<{t}>();"));
        w(&mut s, 3, format!("if (gk < {k}u) {{"));
        for (q, comp) in XYZW.iter().enumerate() {
            let load = if conv {
                format!("fg_im2col(bt, gk, c + {q}u)")
            } else {
                format!("{rv}(b_base + gk * {n}u + c + {q}u)")
            };
            w(&mut s, 4, format!("if (c + {q}u < {n}u) {{ x.{comp} = {load}; }}"));
        }
        w(&mut s, 3, "}".into());
        if coop.is_some() {
            for (q, comp) in XYZW.iter().enumerate() {
                w(&mut s, 3, format!("fg_tile_b[e * 4u + {q}u] = f16(x.{comp});"));
            }
        } else {
            w(&mut s, 3, "fg_tile_b[e] = x;".into());
        }
        w(&mut s, 2, "}".into());
    }
    w(&mut s, 2, "workgroupBarrier();".into());
    if let Some(p) = &prefetch {
        p.load(&mut s, &format!("k0 + {tk}u"), false);
    }
    match coop {
        Some(cp) => coop_compute(&mut s, &cp, (tm, tn), (bm, bn), tk, &groups),
        None => tiled_compute(&mut s, (tm, tn), (bm, bn), tk, &groups),
    }

    // Epilogue and store, in-range outputs only: column `c` of the invocation's block is
    // `gcP + c % 4` (P = c / 4), element `idx + gcP + c % 4` of the output.
    let e = format!("e{}_acc", output.index());
    for p in 0..bn / 4 {
        w(&mut s, 1, format!("let gc{p} = col0 + {};", groups.column(p)));
    }
    let col = |c: usize| format!("gc{} + {}u", c / 4, c % 4);
    let cols: Vec<String> = (0..bn).map(col).collect();
    inv.read_columns(&mut s, "o_base", &format!("min(row0 + ty * {bm}u, {}u)", m - 1), &cols, n);
    for r in 0..bm {
        w(&mut s, 1, format!("if (row0 + ty * {bm}u + {r}u < {m}u) {{"));
        w(&mut s, 2, format!("let idx = o_base + (row0 + ty * {bm}u + {r}u) * {n}u;"));
        let given = inv.read_row(&mut s, "idx");
        for c in 0..bn {
            // `eO_acc`'s arguments after the index: the accumulator, then the invariants.
            let acc = |c: usize| format!("acc{r}_{}.{}{}", c / 4, XYZW[c % 4], given(c));
            if packed_halves(out_dt, opts) {
                // `n` is even and `gcP` a multiple of 4: both halves of each word are ours.
                if c % 2 == 0 {
                    w(
                        &mut s,
                        2,
                        format!(
                            "if ({} < {n}u) {{ b{k_out}[(idx + {}) >> 1u] = \
                             pack2x16float(vec2<f32>({e}(idx + {}, {}), {e}(idx + {}, {}))); }}",
                            col(c),
                            col(c),
                            col(c),
                            acc(c),
                            col(c + 1),
                            acc(c + 1)
                        ),
                    );
                }
            } else if vec4_store {
                // `n` is a multiple of 4 and so are `idx` and `gcP`: whole aligned vec4s.
                if c % 4 == 0 {
                    let value = |c: usize| store_value(out_dt, &format!("{e}(idx + {}, {})", col(c), acc(c)));
                    let quad = vec4_value(out_dt, [value(c), value(c + 1), value(c + 2), value(c + 3)]);
                    let at = col(c);
                    w(&mut s, 2, format!("if ({at} < {n}u) {{ b{k_out}[(idx + {at}) >> 2u] = {quad}; }}"));
                }
            } else {
                let value = store_value(out_dt, &format!("{e}(idx + {}, {})", col(c), acc(c)));
                w(&mut s, 2, format!("if ({} < {n}u) {{ b{k_out}[idx + {}] = {value}; }}", col(c), col(c)));
            }
        }
        w(&mut s, 1, "}".into());
    }
    w(&mut s, 0, "}".into());
    (s, workgroups)
}

/// The compute phase of the plain tiled kernel: rows ty*bm.., column groups `groups` of the
/// tile; (bm + bn) / 4 vec4 loads per bm × bn multiply-adds.
pub(crate) fn tiled_compute(
    s: &mut String,
    (tm, tn): (usize, usize),
    (bm, bn): (usize, usize),
    tk: usize,
    groups: &ColumnGroups,
) {
    let w = line;
    w(s, 2, format!("for (var kk = 0u; kk < {tk}u; kk = kk + 1u) {{"));
    for q in 0..bm / 4 {
        w(s, 3, format!("let a{q} = fg_tile_a[kk * {}u + ty * {}u + {q}u];", tm / 4, bm / 4));
    }
    for p in 0..bn / 4 {
        w(s, 3, format!("let b{p} = fg_tile_b[kk * {}u + {}];", tn / 4, groups.at(p)));
    }
    for r in 0..bm {
        for p in 0..bn / 4 {
            w(s, 3, format!("acc{r}_{p} = acc{r}_{p} + a{}.{} * b{p};", r / 4, XYZW[r % 4]));
        }
    }
    w(s, 2, "}".into());
    w(s, 2, "workgroupBarrier();".into());
    w(s, 1, "}".into());
}

/// How the tiled kernel stages the operands it reads straight from their bindings
/// ([`TiledPlan::vec4_lhs`], [`TiledPlan::vec4_rhs`]): each invocation holds its share of the
/// next `k` slice in registers (`pa{l}`, `pb{l}`: a vec4 of the storage type per load, one
/// bounds check each, where the operand functions take a load and a check per value), loaded
/// right after the slice before is in workgroup memory, so those loads are in flight during
/// the multiply-adds; at the top of the next step they are stored to the tiles.
///
/// Both operands are handled alike, as `outer × k` (the lhs's `m` rows, the rhs's `n`
/// columns): a load holds four elements adjacent along `k` or along `outer`, element `(o, kk)`
/// of the tile is `o` from the tile's origin (`row0`, `col0`) and `kk` from `k0`.
pub(crate) struct Prefetch {
    pub(crate) lhs: Option<Staged>,
    pub(crate) rhs: Option<Staged>,
    /// `m`, `n`, `k` of the product.
    pub(crate) dims: (usize, usize, usize),
    /// `tm`, `tn`, `tk` of the tiling.
    pub(crate) tile: (usize, usize, usize),
    /// Invocations per workgroup.
    pub(crate) wgs: usize,
    /// The operands' storage element (`f32`, `f16`, `i32`, `u32`).
    pub(crate) elem: &'static str,
    /// The tiles' element: `f16` on cooperative matrices, else the compute type.
    pub(crate) tile_elem: &'static str,
    /// The cooperative kernel's tile layouts (scalars, row-major: the lhs `tm × tk`, the rhs
    /// `tk × tn`) instead of the plain kernel's (vec4s of four adjacent `outer` at one `k`,
    /// the vec4s of each `k` together).
    pub(crate) coop: bool,
}

/// One prefetched operand: its binding index, whether its vec4s run along `k`, and where
/// element `(o, kk)` of the operand's batch entry lies in the binding: `base + o·outer +
/// kk·k_stride` (`base` a WGSL expression of the batch coordinates).
pub(crate) struct Staged {
    pub(crate) binding: usize,
    pub(crate) along_k: bool,
    pub(crate) base: String,
    pub(crate) outer: usize,
    pub(crate) k_stride: usize,
}

impl Staged {
    /// The staging of operand `op` (the lhs where `lhs`) read as `v` from binding `binding`,
    /// at the result's batch coordinates `bc` (its batch dims are the result's last ones,
    /// broadcast where 1).
    pub(crate) fn of(
        g: &Graph,
        kernel: &Kernel,
        op: NodeId,
        v: Vec4Operand,
        lhs: bool,
        bc: &[String],
        binding: usize,
    ) -> Staged {
        let view = strided_view(g, kernel, op).expect("the plan's strided view");
        let (od, st) = (g.ty(op).shape.dims(), &view.strides);
        let r = od.len();
        let mut terms: Vec<String> = (view.offset > 0).then(|| format!("{}u", view.offset)).into_iter().collect();
        for q in 0..r - 2 {
            if od[q] > 1 && st[q] > 0 {
                terms.push(format!("{} * {}u", bc[q + bc.len() + 2 - r], st[q]));
            }
        }
        let base = if terms.is_empty() { "0u".to_string() } else { terms.join(" + ") };
        let (outer, k_stride) = if lhs { (st[r - 2], st[r - 1]) } else { (st[r - 1], st[r - 2]) };
        Staged { binding, along_k: v.along_k, base, outer, k_stride }
    }
}

/// `expr · stride` in WGSL (`None` for stride 0).
pub(crate) fn scaled(expr: &str, stride: usize) -> Option<String> {
    match stride {
        0 => None,
        1 => Some(expr.to_string()),
        s => Some(format!("({expr}) * {s}u")),
    }
}

impl Prefetch {
    /// The lhs's or the rhs's staging, with its tile side (`tm`, `tn`), extent (`m`, `n`),
    /// origin and register and tile names.
    pub(crate) fn side(&self, lhs: bool) -> (Option<&Staged>, usize, usize, &'static str, &'static str) {
        let ((m, n, _), (tm, tn, _)) = (self.dims, self.tile);
        if lhs {
            (self.lhs.as_ref(), tm, m, "row0", "a")
        } else {
            (self.rhs.as_ref(), tn, n, "col0", "b")
        }
    }

    /// vec4 loads per invocation per slice of the operand.
    pub(crate) fn count(&self, lhs: bool) -> usize {
        let (_, side, ..) = self.side(lhs);
        side * self.tile.2 / 4 / self.wgs
    }

    /// WGSL defining `o` and `kq`, the tile coordinates of the first of the four elements of
    /// load `l` of the operand.
    pub(crate) fn coords(&self, lhs: bool, l: usize) -> String {
        let (staged, side, ..) = self.side(lhs);
        let (tk, e) = (self.tile.2, format!("({}u + lid)", l * self.wgs));
        match staged {
            Some(Staged { along_k: true, .. }) => {
                format!("let o = {e} / {q}u; let kq = ({e} % {q}u) * 4u;", q = tk / 4)
            }
            _ => format!("let kq = {e} / {q}u; let o = ({e} % {q}u) * 4u;", q = side / 4),
        }
    }

    /// Loads (declaring the registers where `declare`) the slice starting at `k0`.
    pub(crate) fn load(&self, s: &mut String, k0: &str, declare: bool) {
        let (k, indent, elem) = (self.dims.2, if declare { 1 } else { 2 }, self.elem);
        for lhs in [true, false] {
            let (Some(st), _, extent, origin, name) = self.side(lhs) else { continue };
            let index: Vec<String> = [
                (st.base != "0u").then(|| st.base.clone()),
                scaled(&format!("{origin} + o"), st.outer),
                scaled(&format!("{k0} + kq"), st.k_stride),
            ]
            .into_iter()
            .flatten()
            .collect();
            let index = index.join(" + ");
            for l in 0..self.count(lhs) {
                let decl = if declare { "var " } else { "" };
                line(s, indent, format!("{decl}p{name}{l} = vec4<{elem}>();"));
                line(
                    s,
                    indent,
                    format!(
                        "{{ {} if ({origin} + o < {extent}u && {k0} + kq < {k}u) {{ p{name}{l} = b{}[({index}) >> 2u]; }} }}",
                        self.coords(lhs, l),
                        st.binding
                    ),
                );
            }
        }
    }

    /// Stores the operand's registers to its tile: element `(o, kk)` to the cooperative
    /// kernel's row-major tile, or to component `o % 4` of the plain tile's vec4 — the
    /// whole vec4 at once where the load ran along `outer` and the types agree.
    pub(crate) fn store(&self, s: &mut String, lhs: bool) {
        let (Some(st), side, _, _, name) = self.side(lhs) else { return };
        let (tk, t) = (self.tile.2, self.tile_elem);
        let cast = |v: String| if self.elem == t { v } else { format!("{t}({v})") };
        for l in 0..self.count(lhs) {
            line(s, 2, format!("{{ {}", self.coords(lhs, l)));
            if !self.coop && !st.along_k {
                let v = if self.elem == t { format!("p{name}{l}") } else { format!("vec4<{t}>(p{name}{l})") };
                line(s, 3, format!("fg_tile_{name}[kq * {}u + o / 4u] = {v};", side / 4));
            } else {
                for (q, comp) in XYZW.iter().enumerate() {
                    let (o, kk) = if st.along_k {
                        ("o".to_string(), format!("kq + {q}u"))
                    } else {
                        (format!("o + {q}u"), "kq".to_string())
                    };
                    let at = match (self.coop, lhs) {
                        (false, _) => format!("[({kk}) * {}u + ({o}) / 4u][({o}) % 4u]", side / 4),
                        (true, true) => format!("[({o}) * {tk}u + {kk}]"),
                        (true, false) => format!("[({kk}) * {side}u + {o}]"),
                    };
                    line(s, 3, format!("fg_tile_{name}{at} = {};", cast(format!("p{name}{l}.{comp}"))));
                }
            }
            line(s, 2, "}".into());
        }
    }
}
