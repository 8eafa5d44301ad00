"""Writes `*_u4.wgsl` beside the chain's and the copy's kernels of scripts/chain_variants.sh:
each invocation takes four vec4 steps (t + j*stride), every load first, then the arithmetic,
then the guarded stores. Usage: gen_chain.py DIR."""
import re, sys
def unroll(src, U, name):
    head, rest = src.split("@compute", 1)
    lines = rest.split("\n")
    fi = next(i for i, l in enumerate(lines) if "for (var t" in l)
    # find end of for body: line '    }' after fi
    ei = next(i for i in range(fi + 1, len(lines)) if lines[i] == "    }")
    body = lines[fi + 1:ei]
    m = re.search(r"t < (\d+)u", lines[fi]); V = int(m.group(1))
    lines[fi] = lines[fi].replace("t = t + stride", f"t = t + {U}u * stride")
    ident = re.compile(r"\b([xy]\d+_\d+|vq\d+|i_\d+)\b")
    loads, comp, stores = [], [], []
    for l in body:
        if re.search(r"= b\d+\[i_0 >> 2u\];", l): loads.append(l)
        elif re.match(r"\s+b\d+\[t\] =", l): stores.append(l)
        else: comp.append(l)
    out = []
    for u in range(U):
        out.append(f"        let t{u} = min(t + {u}u * stride, {V-1}u);")
    def sub(l, u):
        l = ident.sub(lambda m: m.group(1) + f"_u{u}", l)
        return re.sub(r"\bt\b", f"t{u}", l)
    # i_ lines are in comp; put them first
    ilines = [l for l in comp if "let i_" in l]
    comp = [l for l in comp if "let i_" not in l]
    for u in range(U): out += [sub(l, u) for l in ilines]
    for u in range(U): out += [sub(l, u) for l in loads]
    for u in range(U): out += [sub(l, u) for l in comp]
    for u in range(U):
        for l in stores:
            s = sub(l, u).strip()
            out.append(f"        if (t + {u}u * stride < {V}u) {{ {s} }}")
    lines[fi + 1:ei] = out
    text = head + "@compute" + "\n".join(lines)
    text = re.sub(r"// kernel (\S+) \((\d+) workgroups\)", lambda m: f"// kernel {name} ({int(m.group(2)) // U} workgroups)", text)
    return text
d = sys.argv[1]
for base in ["chain", "chain16", "copy", "copy16"]:
    src = open(f"{d}/{base}.wgsl").read()
    open(f"{d}/{base}_u4.wgsl", "w").write(unroll(src, 4, base + "_u4"))
