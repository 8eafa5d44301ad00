#!/usr/bin/env bash
# Reads time_wgsl's lines for scripts/chain_variants.sh's kernels over N elements (stdin) and
# adds each kernel's GB/s (copies 8 bytes per element, the chain 12; half for the f16 ones)
# and its share of its own dtype's copy, which must come first.
# Usage: time_wgsl N RUNS auto copy.wgsl [copy16.wgsl] ... | scripts/chain_report.sh N
n=$1
awk -v n="$n" '!/: median / { print; next } { ms = $3; f = $1; sub(".*/", "", f);
    bytes = (f ~ /^copy/ ? 8 : 12) * n / (f ~ /16\.wgsl/ ? 2 : 1); gbps = bytes / ms / 1e6;
    if (f == "copy.wgsl:") copy = gbps; if (f == "copy16.wgsl:") copy16 = gbps;
    c = (f ~ /16\.wgsl/) ? copy16 : copy;
    printf "%s  %.2f GB/s (%.0f%% of copy)\n", $0, gbps, 100 * gbps / c }'
