#!/usr/bin/env bash
# The GPU run: everything measured on a lent NVIDIA machine (the `device` tool), in one
# call, since each machine start costs minutes of a short budget.
#
# Here (the CPU machine), from the project root:
#   ./scripts/gpu.sh pack        # builds, fetches the Vulkan loader into .gl/ and copies the
#                                # release binaries and test executables into .gpu-bin/
# There (device `run`, carry [".gl", ".gpu-bin"]):
#   ./scripts/gpu.sh run [PHASE ...]   # phases: info tests roofline bench examples peers (all when
#                                      # none is named; also: llama (Llama-3.2-1B shapes in bf16:
#                                      # prefill and decode), quant (the same with bf16, q8_0
#                                      # and q4_0 matrices, and bf16 sampled), skinny (the copy,
#                                      # 8-row products and the decode_gemv rows per weight
#                                      # format and columns per workgroup), cold (a model's first run with
#                                      # nothing measured, then warm), profile, coop (the matmul rows
#                                      # only, every cooperative tiling),
#                                      # chain (the elementwise chain's kernel beside edits
#                                      # that take its parts away: what bounds it),
#                                      # splitk (the transformer block with split-k off, at
#                                      # three occupancy targets and tuned, in turn),
#                                      # stream (the copy's variants and the chain, back to
#                                      # back and one dispatch a submission), gpt2 (GPT-2
#                                      # 124M decode, f32 and f16),
#                                      # moe (OLMoE-1B-7B's shapes, bf16 and q4_0: prefill
#                                      # and decode at batch 1 and 8), mla (DeepSeek-V2-Lite's
#                                      # likewise: latent attention beside 64 experts),
#                                      # checks (matmul rows, the chain's kernels and the
#                                      # transformer block with wgpu's shader checks on and
#                                      # off, in turn));
#                                      # logs and JSON
#                                      # land in $OUT
#
# Every phase has a time limit so one slow phase cannot take the others' results with it.
set -uo pipefail
cd "$(dirname "$0")/.."

# A 512-token prefill and decode tokens/s at batch 1 and 8 of `tests/data/configs/$4.json`'s
# shapes (named $3) with random bf16 weights, its matrices each of the quantizations after the
# fifth argument in turn (`--quantize`), each run within $5 seconds, with the last step's
# slowest kernel groups: into $OUT/$1.log and $OUT/$2-QUANT-bBATCH.json (phases quant, moe and mla).
decode_rows() {
    local log=$1 json=$2 name=$3 config=$4 limit=$5
    shift 5
    local ids
    ids=$(seq -s, 1000 1511)
    for b in 1 8; do
        for q in "$@"; do
            echo "== generate, $name shapes, matrices $q (bf16 otherwise), batch $b" | tee -a "$OUT/$log.log"
            timeout "$limit" $B/fusegraph generate --random-config "tests/data/configs/$config.json" \
                --dtype bf16 --quantize "$q" --prompt-ids "$ids" --tokens 64 --warmup 4 --batch $b \
                --profile 5 --json "$OUT/$json-$q-b$b.json" 2>&1 | grep -E "^(prefill|profile|  )" \
                | tee -a "$OUT/$log.log"
        done
    done
}

pack() {
    set -e
    cargo build --release --workspace --bins --examples
    cargo test --release --workspace --no-run --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 > /tmp/fg-test-executables
    ../shared/gpu/prepare.sh  # the loader packages into .gl/
    local stage=/tmp/fg-gpu-stage
    rm -rf "$stage" .gpu-bin/*
    mkdir -p "$stage/tests"
    cp target/release/fusegraph target/release/examples/{quickstart,mlp,cnn,transformer,memory_limit,train,generate} "$stage/"
    # The chain's kernel and its variants in the GPU form at the roofline's 64 Mi elements,
    # and the program that times them (phase chain).
    cargo build --release -p fusegraph-runtime --example time_wgsl
    cp target/release/examples/time_wgsl "$stage/"
    FG=target/release/fusegraph scripts/chain_variants.sh "$stage/chain" 67108864
    # The copy's hand-written variants (phase stream).
    mkdir -p "$stage/copy" && python3 benchmarks/h100/stream/gen_copy.py "$stage/copy"
    while read -r exe; do
        name=$(basename "$exe")
        # The device-free tests (golden WGSL files read by path from this checkout among them)
        # need no GPU.
        case "$exe" in */examples/*) continue ;; esac  # the examples run in their own phase
        case "$name" in null-*) continue ;; esac
        cp "$exe" "$stage/tests/${name%-*}"
    done < /tmp/fg-test-executables
    strip "$stage"/* "$stage"/tests/* 2>/dev/null || true
    # The binaries share most of their code: one solid archive with a large window is ~8x
    # smaller than the stripped files, which keeps the carried tree under 64 MiB.
    realpath target/release/fusegraph > .gpu-bin/fusegraph-path
    tar -C "$stage" -cf - . | xz -T2 --lzma2=preset=3,dict=256MiB > .gpu-bin/fg.tar.xz
    du -sh .gl .gpu-bin
}

# The roofline's matmul rows with environment variable $1 set to each of $4… in turn, twice,
# headed "$2 VALUE, round R" and logged to $3 (run's $B is the unpacked archive).
matmul_in_turn() {
    local var=$1 label=$2 log=$3
    shift 3
    for round in 1 2; do
        for v in "$@"; do
            echo "== $label $v, round $round" | tee -a "$log"
            env "$var=$v" timeout 120 "$B"/fusegraph roofline --kernels matmul --runs 5 2>&1 \
                | tee -a "$log" | grep -E "^matmul"
        done
    done
}

run() {
    OUT=${OUT:-/tmp/fg-out}
    mkdir -p "$OUT"
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export XDG_CACHE_HOME=/tmp/fg-cache XDG_RUNTIME_DIR=/tmp
    nvidia-smi -L
    mkdir -p /tmp/fg && tar -C /tmp/fg -xJf .gpu-bin/fg.tar.xz || exit 1
    local B=/tmp/fg
    # tests/cli.rs runs the program from the path it was built at.
    local bin_path
    bin_path=$(cat .gpu-bin/fusegraph-path 2>/dev/null) && mkdir -p "$(dirname "$bin_path")" && cp $B/fusegraph "$bin_path"
    local phases=("$@")
    [ ${#phases[@]} -eq 0 ] && phases=(info roofline peers bench examples tests)
    for phase in "${phases[@]}"; do
        local t0=$SECONDS
        echo "=== $phase"
        case "$phase" in
        info)
            $B/fusegraph info
            $B/fusegraph info --json > "$OUT/info.json"
            ;;
        tests)
            # Every test executable (the crates' unit tests, `null`, `device`), the device
            # binary last; FG_TESTS="device_ops:: split_reduce::" passes test-name filters to
            # it. Each runs until the deadline, so the device call's 600 s limit cannot take
            # the logs with it.
            local deadline=${FG_GPU_DEADLINE:-540}
            for t in $(ls $B/tests/* | grep -v '/device$') $B/tests/device; do
                local left=$((deadline - SECONDS))
                if [ $left -lt 10 ]; then echo "out of time before $(basename "$t")"; break; fi
                local filters=()
                [ "$(basename "$t")" = device ] && [ -n "${FG_TESTS:-}" ] && read -ra filters <<< "$FG_TESTS"
                timeout $left "$t" --test-threads 4 "${filters[@]}" > "$OUT/t.log" 2>&1
                local rc=$?
                grep -E "^test result|FAILED|panicked" "$OUT/t.log" | sed "s|^|$(basename "$t"): |" | head -20
                cat "$OUT/t.log" >> "$OUT/tests.log"
                [ $rc -ne 0 ] && echo "$(basename "$t"): exit $rc"
            done
            rm -f "$OUT/t.log"
            ;;
        roofline)
            # The families issue #6 states targets for, then the other contractions and
            # pooling in a call of their own, so that those cannot push the first past its
            # time limit.
            timeout 150 $B/fusegraph roofline --kernels copy,elementwise,reduce,softmax,layer,matmul \
                --json "$OUT/roofline.json" 2>&1 | tee "$OUT/roofline.log" | grep -v "^timing"
            timeout 90 $B/fusegraph roofline --kernels copy,batched,skinny,conv,max_pool --runs 5 \
                --json "$OUT/roofline-more.json" 2>&1 | tee -a "$OUT/roofline.log" | grep -v "^timing"
            # The autotuner's choices, per shape class.
            cat "$XDG_CACHE_HOME"/fusegraph/* 2>/dev/null | tee -a "$OUT/roofline.log"
            ;;
        rooflinequick)
            # The families with stated targets only, five runs a row.
            timeout 120 $B/fusegraph roofline --kernels copy,elementwise,reduce,softmax,layer,matmul --runs 5 \
                --json "$OUT/roofline.json" 2>&1 | tee "$OUT/roofline.log" | grep -v "^timing"
            cat "$XDG_CACHE_HOME"/fusegraph/* 2>/dev/null >> "$OUT/roofline.log"
            ;;
        coop)
            # The matmul rows only: the tuner's picks, each cooperative-matrix tiling forced
            # (rows `matmul coop TILING`), and the best of them against f32.
            timeout 240 $B/fusegraph roofline --kernels matmul --runs 5 --json "$OUT/coop.json" 2>&1 \
                | tee "$OUT/coop.log" | grep -v "^timing"
            cat "$XDG_CACHE_HOME"/fusegraph/* 2>/dev/null | tee -a "$OUT/coop.log"
            ;;
        chain)
            # What bounds the elementwise chain (47% of copy on an H100):
            # its kernel as generated beside edits that take its parts away and the copy, f32
            # and native f16 (scripts/chain_variants.sh), 64 Mi elements, in turn per round,
            # GPU timestamps; twice.
            for round in 1 2; do
                echo "== chain, round $round" | tee -a "$OUT/chain.log"
                timeout 120 $B/time_wgsl 67108864 15 auto $B/chain/copy.wgsl $B/chain/copy16.wgsl \
                    $(ls $B/chain/*.wgsl | grep -v /copy) 2>&1 | sed "s|$B/chain/||" \
                    | scripts/chain_report.sh 67108864 | tee -a "$OUT/chain.log"
            done
            ;;
        checks)
            # wgpu's runtime checks (FUSEGRAPH_SHADER_CHECKS=on: index clamps on workgroup
            # tiles and vectors, a counter in every loop, which may keep the driver from
            # unrolling the matmul's inner loop) against trusted modules without them (off,
            # the default): the matmul rows, the chain's kernels (f32 and f16, with the
            # copies) and the transformer block, in turn, twice.
            matmul_in_turn FUSEGRAPH_SHADER_CHECKS "shader checks" "$OUT/checks.log" on off
            for round in 1 2; do
                echo "== chain, shader checks on and off, round $round" | tee -a "$OUT/checks.log"
                timeout 120 $B/time_wgsl --checks both 67108864 15 auto $B/chain/copy.wgsl \
                    $B/chain/chain.wgsl $B/chain/copy16.wgsl $B/chain/chain16.wgsl 2>&1 | sed "s|$B/chain/||" \
                    | tee -a "$OUT/checks.log"
                for v in on off; do
                    echo "== transformer, shader checks $v, round $round" | tee -a "$OUT/checks.log"
                    FUSEGRAPH_SHADER_CHECKS=$v timeout 60 $B/fusegraph bench --workload transformer --runs 20 2>&1 \
                        | tee -a "$OUT/checks.log" | grep -E "transformer|speedup"
                done
            done
            ;;
        splitk)
            # The transformer block (256×768 outputs: 12 tiles of 128×128) with its products
            # split over k until each has W workgroups, and as tuned on the card, against no
            # split, twice in turn; then the profile of the best guess (132 SMs: two
            # workgroups each) and the tuner's choices.
            for round in 1 2; do
                for s in off fill:132 fill:264 fill:528 tuned; do
                    echo "== split-k $s, round $round" | tee -a "$OUT/splitk.log"
                    timeout 60 $B/fusegraph bench --split-k $s --workload transformer --runs 20 2>&1 \
                        | tee -a "$OUT/splitk.log" | grep -E "transformer|speedup"
                done
            done
            timeout 60 $B/fusegraph bench --split-k fill:264 --workload transformer --runs 10 --profile \
                >> "$OUT/splitk.log" 2>&1
            cat "$XDG_CACHE_HOME"/fusegraph/splitk-* 2>/dev/null | tee -a "$OUT/splitk.log"
            ;;
        peers)
            # Burn beside fusegraph on the same workloads, in turn, twice
            # (../shared/peers/README.md; `compare.sh pack .gpu-bin` put both binaries there).
            # Packed with `tar -C .gpu-bin -cf - burn-bench fg-bench | xz > .gpu-bin/peers.tar.xz`
            # where the stripped binaries are too large to carry as they are.
            local P=.gpu-bin
            if [ -f .gpu-bin/peers.tar.xz ]; then
                P=/tmp/fg-peers && mkdir -p $P && tar -C $P -xJf .gpu-bin/peers.tar.xz
            fi
            if [ -x $P/burn-bench ] && [ -x $P/fg-bench ]; then
                for round in $(seq "${PEER_ROUNDS:-2}"); do
                    echo "== round $round: Burn" | tee -a "$OUT/peers.log"
                    timeout 90 $P/burn-bench 2>&1 | tee -a "$OUT/peers.log"
                    echo "== round $round: fusegraph" | tee -a "$OUT/peers.log"
                    timeout 90 $P/fg-bench 2>&1 | tee -a "$OUT/peers.log"
                done
            else
                echo "no peer binaries in .gpu-bin (../shared/peers/compare.sh build; compare.sh pack .gpu-bin)"
            fi
            ;;
        cold)
            # The first run of a model on an adapter with nothing measured yet (a fresh cache
            # folder: the cost model, kernel forms, matmul families and tilings all measured
            # in the run), then the same run again reading the cache; wall seconds each, and
            # per new shape class the candidates timed and the seconds spent.
            for w in mlp transformer_s256_l2; do
                local cache=/tmp/fg-cold-$w
                rm -rf "$cache"
                for run in cold warm; do
                    local t=$(date +%s%N)
                    XDG_CACHE_HOME=$cache FUSEGRAPH_LOG=fusegraph::autotune=info timeout 120 \
                        $B/fusegraph bench --workload $w --runs 5 > "$OUT/cold-$w-$run.log" 2>&1
                    local rc=$?
                    echo "== $w $run: $(( ($(date +%s%N) - t) / 1000000 )) ms (exit $rc)" | tee -a "$OUT/cold.log"
                    grep -E "tuned|kernel form|matmul family" "$OUT/cold-$w-$run.log" | sed 's/\x1b\[[0-9;]*m//g' \
                        | tee -a "$OUT/cold.log" | tail -12
                done
            done
            ;;
        generate)
            # GPT-2 small's shapes with random weights: tokens/s at batch 1 and 8, and the
            # decode step's time at positions 16, 128 and 512 (flat: a step reads the whole
            # cache under a mask).
            for b in 1 8; do
                echo "== generate, GPT-2 124M shapes, batch $b" | tee -a "$OUT/generate.log"
                timeout 150 $B/generate --random --prompt Hi --tokens 515 --max-seq 520 --batch $b \
                    --report-at 16,128,512 --json "$OUT/generate-b$b.json" 2>&1 | grep -v "^\[" | tee -a "$OUT/generate.log"
            done
            ;;
        stream)
            # The copy's variants and the chain's kernel as generated, dispatched 20 times
            # back to back per timing, then once per submission (benchmarks/h100/notes.md).
            for reps in 20 1; do
                echo "== stream, $reps dispatches a pass" | tee -a "$OUT/stream.log"
                timeout 120 $B/time_wgsl --checks off --reps $reps 67108864 15 auto $B/copy/*.wgsl \
                    $B/chain/copy.wgsl $B/chain/chain.wgsl $B/chain/copy16.wgsl $B/chain/chain16.wgsl 2>&1 \
                    | sed "s|$B/||" | tee -a "$OUT/stream.log"
            done
            ;;
        gpt2)
            # GPT-2 124M's shapes with random weights in f32 and f16: decode at batch 1 over
            # the whole 1,024-position cache, the step's kernels, bytes, time and host share
            # at positions 16 and 1,000 (a step per cache length: 64 … 1,024 positions), and
            # each kernel's time there (--profile: GPU timestamps, grouped).
            # Then f16 with fused attention (a kernel per layer for scores, softmax and sum),
            # with each step fed its ids on the device while the last is read (the default)
            # and with each step's ids read back before the next is submitted (sync).
            for run in f32 f16 f16-fa f16-fa-sync; do
                local dt=${run%%-*} fa="" sync=""
                case "$run" in *-fa*) fa=--fused-attention ;; esac
                case "$run" in *-sync) sync=--no-overlap ;; esac
                echo "== generate, GPT-2 124M shapes, $run, batch 1" | tee -a "$OUT/gpt2.log"
                timeout 100 $B/fusegraph generate --random-config tests/data/configs/gpt2-124m.json --dtype $dt $fa $sync \
                    --prompt-ids 1,2 --tokens 1010 --max-seq 1024 --warmup 8 --ignore-eos --report-at 16,1000 \
                    --profile 5 --json "$OUT/gpt2-$run-b1.json" 2>&1 | grep -E "^(prefill|step at|compiled|profile| )" \
                    | tee -a "$OUT/gpt2.log"
            done
            ;;
        llama)
            # Llama-3.2-1B's shapes (tests/data/configs) with random bf16 weights: a 512-token
            # prefill (ms) and decode tokens/s at batch 1 and 8.
            local ids
            ids=$(seq -s, 1000 1511)
            for b in 1 8; do
                echo "== generate, Llama-3.2-1B shapes, bf16, batch $b" | tee -a "$OUT/llama.log"
                timeout 100 $B/fusegraph generate --random-config tests/data/configs/llama-3.2-1b.json \
                    --dtype bf16 --prompt-ids "$ids" --tokens 64 --warmup 4 --batch $b --json "$OUT/llama-b$b.json" \
                    2>&1 | tail -3 | tee -a "$OUT/llama.log"
            done
            ;;
        quant)
            # Llama-3.2-1B's shapes with random weights, the matrices bf16, q8_0 and q4_0
            # (quantized on load), the rest bf16: a 512-token prefill and decode tokens/s at
            # batch 1 and 8, the three in turn, and the last step's slowest kernel groups.
            local ids
            ids=$(seq -s, 1000 1511)
            decode_rows quant llama Llama-3.2-1B llama-3.2-1b 90 none q8_0 q4_0
            # Sampling on the device (temperature, top-k, top-p: the step's halvings) beside
            # the greedy bf16 rows.
            echo "== generate, Llama-3.2-1B shapes, bf16, batch 1, sampled" | tee -a "$OUT/quant.log"
            timeout 90 $B/fusegraph generate --random-config tests/data/configs/llama-3.2-1b.json \
                --dtype bf16 --prompt-ids "$ids" --tokens 64 --warmup 4 --temperature 0.8 --top-k 50 --top-p 0.9 --ignore-eos \
                --json "$OUT/llama-sampled-b1.json" 2>&1 | tail -3 | tee -a "$OUT/quant.log"
            ;;
        moe)
            # A mixture of experts: OLMoE-1B-7B's shapes (64 experts, 8 a token) with random
            # bf16 weights, and its matrices q4_0: a 512-token prefill and decode tokens/s at
            # batch 1 and 8, each step reading the chosen experts' rows alone.
            decode_rows moe moe OLMoE-1B-7B olmoe-1b-7b 150 none q4_0
            ;;
        mla)
            # Multi-head latent attention: DeepSeek-V2-Lite's shapes (15.7B parameters, 64
            # experts, 6 a token, a 576-wide cache per layer) with random bf16 weights, and its
            # matrices q4_0: a 512-token prefill and decode tokens/s at batch 1 and 8.
            decode_rows mla mla DeepSeek-V2-Lite deepseek-v2-lite 240 none q4_0
            ;;
        skinny)
            # The copy, the products of 8 rows (the matrix–vector kernel's), f32 and f16, and
            # a decode step's one-row product over an [n, k] weight in f32, bf16, q8_0 and
            # q4_0, each also with 8, 16 and 32 columns per workgroup forced.
            timeout 180 $B/fusegraph roofline --kernels copy,skinny,decode --runs 5 --json "$OUT/skinny.json" 2>&1 \
                | tee "$OUT/skinny.log" | grep -v "^timing"
            ;;
        bench)
            timeout 150 $B/fusegraph bench --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -40
            ;;
        profile)
            # The slowest kernels of the transformer block, f32, mixed precision and with
            # attention in one kernel.
            {
                timeout 60 $B/fusegraph bench --workload transformer --runs 10 --profile
                timeout 60 $B/fusegraph bench --workload transformer --runs 10 --profile --mixed-precision
                timeout 60 $B/fusegraph bench --workload transformer --runs 10 --profile --fused-attention
            } > "$OUT/profile.log" 2>&1
            grep -v "^\[" "$OUT/profile.log" | tail -120
            ;;
        examples)
            {
                for e in quickstart mlp cnn memory_limit train; do
                    echo "== example: $e"
                    timeout 30 "$B/$e"
                done
                for flags in "" "--mixed-precision" "--fused-attention"; do
                    echo "== example: transformer $flags"
                    timeout 30 $B/transformer $flags
                done
            } > "$OUT/examples.log" 2>&1
            grep -E "^==|error|Error|mismatch|max |identical|MiB|ms" "$OUT/examples.log" | head -80
            ;;
        *) echo "unknown phase $phase" ;;
        esac
        echo "=== $phase took $((SECONDS - t0)) s"
    done
}

case "${1:-}" in
pack) pack ;;
run) shift; run "$@" ;;
*) echo "usage: scripts/gpu.sh pack | run [info tests roofline bench examples generate ...]" >&2; exit 2 ;;
esac
