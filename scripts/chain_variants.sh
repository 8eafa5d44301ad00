#!/usr/bin/env bash
# Writes the 20-op elementwise chain's kernel (the `elementwise_chain` workload: five rounds
# of add, mul by 0.5, tanh, sub) over N elements as fusegraph generates it, beside edits that
# take its parts away, and the runtime's copy kernel, for `time_wgsl` to time in turn:
#   copy.wgsl      y = -x, f32 (8 bytes per element; the chain moves 12)
#   chain.wgsl     as generated (five `fg_tanh` per element)
#   core.wgsl      `fg_tanh` = the rational function alone (no clamp, no NaN test: wrong past
#                  |x| > 7.9, for timing only)
#   div.wgsl       one fma and one division in place of tanh
#   identity.wgsl  tanh(x) = x (the chain's loads, stores and 15 cheap ops)
#   builtin.wgsl   WGSL's `tanh`
# and, for a GPU (no --cpu), the same chain with f16 storage (native `f16`):
#   copy16.wgsl, chain16.wgsl (every value rounded to f16 by `fg_round_f16`, as generated),
#   noround16.wgsl (`fg_round_f16` = identity), convert16.wgsl (`f32(f16(x))`: the driver's
#   conversion, which may flush f16 subnormals — timing only).
# Usage: scripts/chain_variants.sh DIR N [--cpu]   (FG=path/to/fusegraph, default
# target/release/fusegraph). With --cpu, the form for a CPU adapter (four elements side by
# side per invocation, four grid-stride steps each).
set -euo pipefail
dir=$1 n=$2 cpu=${3:-}
fg=${FG:-target/release/fusegraph}
mkdir -p "$dir"
# The chain's graph as `fusegraph bench` builds it, at N elements; f16 by its types.
"$fg" ir "elementwise_chain_$n" > "$dir/chain_f32.ir" 2>/dev/null
sed 's/f32\[/f16[/g' "$dir/chain_f32.ir" > "$dir/chain_f16.ir"
for dt in f32 f16; do
    [ "$dt" = f16 ] && [ -n "$cpu" ] && continue
    printf '%%0 = input() {name="x"} : %s[%s]\n%%1 = neg(%%0) : %s[%s]\n' "$dt" "$n" "$dt" "$n" > "$dir/copy_$dt.ir"
    flags=$cpu
    [ "$dt" = f16 ] && flags="--f16-native"
    for what in chain copy; do
        "$fg" wgsl "$dir/${what}_$dt.ir" $flags > "$dir/${what}_$dt.wgsl" 2>/dev/null
    done
done
python3 - "$dir" <<'PY'
import os, sys
d = sys.argv[1]
def read(name):
    return open(os.path.join(d, name)).read()
def write(name, text):
    open(os.path.join(d, name), "w").write(text)
def function(src, head):
    start = src.index(head)
    return src[start:src.index("\n}\n", start) + 3]
src = read("chain_f32.wgsl")
tanh = function(src, "fn fg_tanh(x: f32) -> f32 {")
core = tanh.replace("clamp(x, -7.90531110763549805f, 7.90531110763549805f)", "x").replace(
    "select(c * p / q, x, nan)", "c * p / q")
assert core != tanh
body = lambda e: "fn fg_tanh(x: f32) -> f32 {\n    return " + e + ";\n}\n"
write("copy.wgsl", read("copy_f32.wgsl"))
write("chain.wgsl", src)
write("core.wgsl", src.replace(tanh, core))
write("div.wgsl", src.replace(tanh, body("x / fma(x, x, 1.0f)")))
write("identity.wgsl", src.replace(tanh, body("x")))
write("builtin.wgsl", src.replace(tanh, body("tanh(x)")))
if os.path.exists(os.path.join(d, "chain_f16.wgsl")):
    src = read("chain_f16.wgsl")
    round16 = function(src, "fn fg_round_f16(x: f32) -> f32 {")
    write("copy16.wgsl", read("copy_f16.wgsl"))
    write("chain16.wgsl", src)
    write("noround16.wgsl", src.replace(round16, "fn fg_round_f16(x: f32) -> f32 {\n    return x;\n}\n"))
    write("convert16.wgsl", src.replace(round16, "fn fg_round_f16(x: f32) -> f32 {\n    return f32(f16(x));\n}\n"))
for f in os.listdir(d):
    if f.endswith(".ir") or f.endswith("_f32.wgsl") or f.endswith("_f16.wgsl"):
        os.remove(os.path.join(d, f))
PY
