"""Writes the copy's hand-written variants timed on the H100 (notes.md): an f32 and an f16
copy (`-x`) of 64 Mi elements with one or more vec4s per invocation, a read-only input,
striding workgroups, other workgroup sizes. Usage: gen_copy.py [DIR] (default: here)."""
import os
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
V = 16777216  # vec4s of 64 Mi f32 (or f16)
def kern(name, ty="f32", ro=False, U=1, wg=256, persistent=None, layout="strided"):
    acc = "read" if ro else "read_write"
    if persistent:
        wgs = persistent
    else:
        wgs = V // (wg * U)
    s = f"// kernel {name} ({wgs} workgroups)\n"
    if ty == "f16":
        s += "enable f16;\n"
    s += f"@group(0) @binding(0) var<storage, {acc}> b0: array<vec4<{ty}>>;\n"
    s += f"@group(0) @binding(1) var<storage, read_write> b1: array<vec4<{ty}>>;\n\n"
    s += f"@compute @workgroup_size({wg})\n"
    s += "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {\n"
    s += f"    let stride = nwg.x * nwg.y * {wg}u;\n"
    step = "stride" if U == 1 else f"{U}u * stride"
    s += f"    for (var t = (wid.y * nwg.x + wid.x) * {wg}u + lid; t < {V}u; t = t + {step}) {{\n"
    for u in range(U):
        if layout == "strided":
            idx = f"t + {u}u * stride" if u else "t"
        s += f"        let v{u} = b0[min({idx}, {V-1}u)];\n" if U > 1 else f"        let v{u} = b0[{idx}];\n"
    for u in range(U):
        idx = f"t + {u}u * stride" if u else "t"
        if U > 1 and u:
            s += f"        if ({idx} < {V}u) {{ b1[{idx}] = -v{u}; }}\n"
        else:
            s += f"        b1[{idx}] = -v{u};\n"
    s += "    }\n}\n"
    open(os.path.join(OUT, name + ".wgsl"), "w").write(s)
for ty in ["f32", "f16"]:
    sfx = "" if ty == "f32" else "16"
    kern("gen" + sfx, ty)
    kern("ro" + sfx, ty, ro=True)
    for U in [2, 4, 8]:
        kern(f"u{U}" + sfx, ty, U=U)
    kern("u4ro" + sfx, ty, ro=True, U=4)
    kern("p2112" + sfx, ty, persistent=2112)
    kern("p2112u4" + sfx, ty, persistent=2112, U=4)
    kern("p1056u4" + sfx, ty, persistent=1056, U=4)
    kern("wg128" + sfx, ty, wg=128)
    kern("wg512" + sfx, ty, wg=512)
    kern("wg1024" + sfx, ty, wg=1024)
    kern("wg512u4" + sfx, ty, wg=512, U=4)
