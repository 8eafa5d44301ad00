//! Assembles one kernel's shader: bindings, load functions, element functions, `main`.

use crate::body::write_body;
use fusegraph_ir::{DType, Graph, NodeId};
use fusegraph_passes::Kernel;
use std::fmt::Write;

/// Invocations per workgroup of every loop kernel.
pub const WORKGROUP_SIZE: u32 = 256;

const HELPERS: &str = include_str!("../../../shaders/helpers.wgsl");

/// Adapter facts that change the generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LowerOptions {
    /// Use WGSL `f16` storage (the adapter has `SHADER_F16`); otherwise f16 values are
    /// stored two to a `u32` and converted with `pack2x16float`/`unpack2x16float`.
    pub f16_native: bool,
}

/// One storage binding of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The value bound.
    pub node: NodeId,
    /// Whether the kernel writes it (an output) or only reads it (an input).
    pub output: bool,
}

/// A lowered kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSource {
    /// WGSL text; entry point `main`.
    pub wgsl: String,
    /// Binding `k` of group 0 is `bindings[k]`.
    pub bindings: Vec<Binding>,
    /// Invocations needed (one per output element, or per packed f16 word).
    pub invocations: u64,
    /// A short label naming the member ops, for debugging and profiles.
    pub label: String,
}

fn storage_elem(dtype: DType, opts: &LowerOptions) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 if opts.f16_native => "f16",
        DType::I32 => "i32",
        _ => "u32",
    }
}

fn packed_f16(dtype: DType, opts: &LowerOptions) -> bool {
    dtype == DType::F16 && !opts.f16_native
}

/// Lowers `kernel` of `g` to WGSL.
pub fn lower(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> KernelSource {
    let mut bindings: Vec<Binding> = kernel.inputs.iter().map(|&node| Binding { node, output: false }).collect();
    bindings.extend(kernel.outputs.iter().map(|&node| Binding { node, output: true }));

    let mut body = String::new();
    for (k, b) in bindings.iter().enumerate() {
        let dt = g.ty(b.node).dtype;
        let _ =
            writeln!(body, "@group(0) @binding({k}) var<storage, read_write> b{k}: array<{}>;", storage_elem(dt, opts));
    }
    body.push('\n');
    for (k, b) in bindings.iter().enumerate().filter(|(_, b)| !b.output) {
        let dt = g.ty(b.node).dtype;
        let load = match dt {
            DType::Bool => format!("b{k}[i] != 0u"),
            DType::F16 if opts.f16_native => format!("f32(b{k}[i])"),
            DType::F16 => {
                format!("select(unpack2x16float(b{k}[i >> 1u]).x, unpack2x16float(b{k}[i >> 1u]).y, (i & 1u) == 1u)")
            }
            _ => format!("b{k}[i]"),
        };
        let _ =
            writeln!(body, "fn v{}(i: u32) -> {} {{\n    return {load};\n}}\n", b.node.index(), crate::writer::vty(dt));
    }
    for &m in &kernel.members {
        let ty = g.ty(m);
        let _ = writeln!(body, "// {} : {}", g.node(m).op.name(), ty);
        let _ = writeln!(body, "fn v{}(i: u32) -> {} {{", m.index(), crate::writer::vty(ty.dtype));
        write_body(g, m, &mut body);
        body.push_str("}\n\n");
    }

    let mut invocations = 0u64;
    let mut main = String::new();
    let _ = writeln!(main, "@compute @workgroup_size({WORKGROUP_SIZE})");
    let _ = writeln!(
        main,
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{"
    );
    let _ = writeln!(main, "    let t = (wid.y * nwg.x + wid.x) * {WORKGROUP_SIZE}u + lid;");
    for (k, b) in bindings.iter().enumerate().filter(|(_, b)| b.output) {
        let ty = g.ty(b.node);
        let n = ty.shape.numel() as u64;
        let f = format!("v{}", b.node.index());
        if packed_f16(ty.dtype, opts) {
            let words = n.div_ceil(2);
            invocations = invocations.max(words);
            let _ = writeln!(main, "    if (t < {words}u) {{");
            let _ = writeln!(main, "        let e = 2u * t;");
            let _ = writeln!(main, "        var hi = 0.0f;");
            let _ = writeln!(main, "        if (e + 1u < {n}u) {{ hi = {f}(e + 1u); }}");
            let _ = writeln!(main, "        b{k}[t] = pack2x16float(vec2<f32>({f}(e), hi));");
            let _ = writeln!(main, "    }}");
        } else {
            invocations = invocations.max(n);
            let value = match ty.dtype {
                DType::Bool => format!("select(0u, 1u, {f}(t))"),
                DType::F16 => format!("f16({f}(t))"),
                _ => format!("{f}(t)"),
            };
            let _ = writeln!(main, "    if (t < {n}u) {{ b{k}[t] = {value}; }}");
        }
    }
    main.push_str("}\n");

    let mut wgsl = String::new();
    let uses_f16 = opts.f16_native && bindings.iter().any(|b| g.ty(b.node).dtype == DType::F16);
    if uses_f16 {
        wgsl.push_str("enable f16;\n\n");
    }
    wgsl.push_str(&body);
    for helper in HELPERS.split("// fn ").skip(1) {
        let name = helper.lines().next().unwrap_or("").trim();
        if !name.is_empty() && body.contains(&format!("{name}(")) {
            let text: String = helper.lines().skip(1).collect::<Vec<_>>().join("\n");
            let _ = writeln!(wgsl, "{}\n", text.trim());
        }
    }
    wgsl.push_str(&main);
    let label = kernel.members.iter().map(|&m| g.node(m).op.name()).collect::<Vec<_>>().join("+");
    KernelSource { wgsl, bindings, invocations, label }
}
