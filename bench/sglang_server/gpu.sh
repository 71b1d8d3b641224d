#!/usr/bin/env bash
# The real-sglang run on the GPU machine, from the repository root:
#
#     bash bench/sglang_server/gpu.sh [SUITE]...    (smoke, gate, correctness, correctness2, flood, stall, attrib,
#                                                    corpus1, corpus2, corpus3, corpus4, cost-a, cost-b, cost-c,
#                                                    cost-1b-a, cost-1b-b, cost-1b-c, cost-turns, cost-1b-turns,
#                                                    http, http-off, http-ours, http-upstream,
#                                                    deploy, mtp, tp2, profile, profile-1b)
#
# Installs every bundle part present under .whl/sglang-server (hash-checked against SHA256SUMS) into
# a scratch folder, once. When every part is in: instruments a copy of the release's sglang package
# (instrument.py: `scaffold`, `apply`, and the gate), then runs the suites named (none: install only). Logs and
# JSON go to $OUT (or bench/_work/sglang_server) as one archive per suite; report.py reads them.
#
# SGLANG_RELEASE=0.5.14 serves that release instead, from its own bundle (.whl/sglang-server-0.5.14, built by
# `bundle.py --release 0.5.14`) and work folder (/tmp/sglang-server-0.5.14); its archives are named
# 0.5.14-SUITE.tar.gz, with the folder 0.5.14-SUITE inside. Unset (or 0.5.17): the default release, as before.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
SGLANG_RELEASE=${SGLANG_RELEASE:-0.5.17}
TAG=""; [ "$SGLANG_RELEASE" = 0.5.17 ] || TAG=$SGLANG_RELEASE  # empty for the default release
WORK=${SGLANG_SERVER_WORK:-/tmp/sglang-server${TAG:+-$TAG}}
BUNDLE=.whl/sglang-server${TAG:+-$TAG}
[ -z "$TAG" ] || [ -e "$BUNDLE/SHA256SUMS" ] || { echo "gpu.sh: no $BUNDLE (bundle.py --release $TAG)" >&2; exit 2; }
DEST=${OUT:-$REPO/bench/_work/sglang_server}
mkdir -p "$WORK/site" "$WORK/done" "$DEST"

for part in "$BUNDLE"/part*; do
    [ -d "$part" ] || continue
    name=$(basename "$part")
    [ -e "$WORK/done/$name" ] && continue
    (cd "$BUNDLE" && grep " $name/" SHA256SUMS | sha256sum -c --quiet) || { echo "gpu.sh: $name: hash mismatch" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
        "$part"/*.whl || exit 2
    touch "$WORK/done/$name"
    echo "gpu.sh: installed $name"
done
parts=$(grep -o ' part[0-9]*/' "$BUNDLE/SHA256SUMS" | sort -u | wc -l)
have=$(ls "$WORK/done" | wc -l)
if [ "$have" -lt "$parts" ]; then
    echo "gpu.sh: $have of $parts bundle parts installed; carry the next part"
    exit 0
fi

# The unmodified release runs canary off and sglang's own canary; the applied copy runs ours.
RELEASE="$WORK/site:$REPO"
OURS="$WORK/ours:$REPO:$WORK/site"
# scaffold, apply, then apply --check and check must be clean (instrument.py; CI runs it on the CPU). Once per
# machine: the call that instruments leaves the log, later calls keep the copy.
if [ ! -d "$WORK/ours/sglang" ]; then
    APPLY_LOG=$DEST/${TAG:+$TAG-}apply.log
    PYTHONPATH=$RELEASE python3 bench/sglang_server/instrument.py "$WORK/site/sglang" "$WORK/ours/sglang" \
        > "$APPLY_LOG" 2>&1 || { cat "$APPLY_LOG"; echo "gpu.sh: the gate is not green on the release" >&2; exit 2; }
fi
export SGLANG_SERVER_MODELS=$WORK/models
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$DEST/device.txt"

# run NAME PYTHONPATH ARGS...: one engine, its log and JSON under $WORK/runs/SUITE.
run() {
    local name=$1 path=$2; shift 2
    PYTHONPATH=$path timeout 900 python3 bench/sglang_server/serve.py "$@" --out "$RUNS/$name.json" \
        >"$RUNS/$name.log" 2>&1
    echo "gpu.sh: $name exit $? ($(date +%T))"
}

# watched NAME PYTHONPATH LIMIT_S ARGS...: as run, under watch.py: a run still going at LIMIT_S has every
# Python stack of its processes dumped into its log, then is killed; NAME.watch.json says how it ended.
watched() {
    local name=$1 path=$2 limit=$3; shift 3
    PYTHONPATH=$path python3 bench/sglang_server/watch.py "$limit" "$RUNS/$name.watch.json" -- \
        python3 bench/sglang_server/serve.py "$@" --out "$RUNS/$name.json" >"$RUNS/$name.log" 2>&1
    echo "gpu.sh: $name $(cat "$RUNS/$name.watch.json") ($(date +%T))"
}

# http NAME PYTHONPATH ARGS...: sglang's HTTP server under its bench_serving (serve_http.py), as run.
http() {
    local name=$1 path=$2; shift 2
    PYTHONPATH=$path timeout 900 python3 bench/sglang_server/serve_http.py "$@" --out "$RUNS/$name.json" \
        >"$RUNS/$name.log" 2>&1
    echo "gpu.sh: $name exit $? ($(date +%T))"
}

# buggy NAME BUG BASE: a copy of BASE's sglang package with BUG in it (bugs.py), as a PYTHONPATH entry.
buggy() {
    python3 bench/sglang_server/bugs.py "$3/sglang" "$WORK/bugs/$1/sglang" "$2" >/dev/null || exit 2
    echo "$WORK/bugs/$1"
}

# three_ways BUG ARGS...: BUG served at once by ours (the applied copy), sglang's own canary and canary off (the
# release), each watched (480 s), in the background; the caller waits.
three_ways() {
    local bug=$1; shift
    local ours release
    ours=$(buggy "$bug-ours" "$bug" "$WORK/ours")
    release=$(buggy "$bug-release" "$bug" "$WORK/site")
    [ -n "$ours" ] && [ -n "$release" ] || exit 2
    watched "$bug.ours" "$ours:$REPO:$WORK/site" 480 "$@" &
    watched "$bug.upstream" "$release:$WORK/site" 480 "$@" &
    watched "$bug.off" "$release:$WORK/site" 480 "$@" --kv-canary none &
}

for suite in "$@"; do
    # http-off, http-ours and http-upstream are the http suite's ways one call each (a server of the 32-layer
    # model takes minutes to start, three of them pass one call's 10 minutes): they add to one archive.
    group=$suite; [[ $suite == http-* ]] && group=http
    RUNS=$WORK/runs/$group
    [ "$group" = "$suite" ] && rm -rf "$RUNS"
    mkdir -p "$RUNS"
    cp "$DEST/device.txt" "$RUNS/device.txt"
    case $suite in
    smoke)
        run mha-clean "$OURS" correctness --layout mha --decode-steps 200
        ;;
    correctness)
        # Engines share the GPU (timing is not measured here); each caps its pool.
        for layout in mha mla swa; do
            run "$layout-clean" "$OURS" correctness --layout "$layout" --mem-fraction 0.9 &
        done
        wait
        for layout in mha mla swa; do
            run "$layout-perturb" "$OURS" correctness --layout "$layout" --perturb 0.02 \
                --kv-canary-sweep-interval 16 --mem-fraction 0.9 &
        done
        run mha-clean-breakable "$OURS" correctness --layout mha --prefill-graph default --mem-fraction 0.9 &
        wait
        ;;
    correctness2)
        # EAGLE, and the prefill graph backends: sglang's default (breakable) and the torch.compile one
        # that sglang's own canary refuses.
        for mode in clean perturb; do
            extra=(); [ $mode = perturb ] && extra=(--perturb 0.02 --kv-canary-sweep-interval 16)
            run "eagle-$mode" "$OURS" correctness --layout eagle "${extra[@]}" --mem-fraction 0.9 &
        done
        run eagle-clean-breakable "$OURS" correctness --layout eagle --prefill-graph default --mem-fraction 0.9 &
        run mha-clean-tc-piecewise "$OURS" correctness --layout mha --prefill-graph tc_piecewise --mem-fraction 0.9 &
        wait
        ;;
    gate)
        # The sites scaffold adds on the release (the prefill graph's capture and compile warm-up, issue 35)
        # active under sglang's default prefill graph and the torch.compile one, beside MLA, SWA and EAGLE.
        run mha-clean-breakable "$OURS" correctness --layout mha --prefill-graph default --decode-steps 1000 \
            --mem-fraction 0.9 &
        run mha-clean-tc-piecewise "$OURS" correctness --layout mha --prefill-graph tc_piecewise \
            --decode-steps 1000 --mem-fraction 0.9 &
        run eagle-clean-breakable "$OURS" correctness --layout eagle --prefill-graph default --decode-steps 1000 \
            --mem-fraction 0.9 &
        for layout in mla swa; do
            run "$layout-clean" "$OURS" correctness --layout "$layout" --decode-steps 1000 --mem-fraction 0.9 &
        done
        wait
        ;;
    http|http-off|http-ours|http-upstream)
        # The HTTP server three ways, one at a time (the timings compare): canary off and sglang's own on the
        # unmodified release, ours on the applied copy; each under bench_serving at every rate.
        [[ $suite == http || $suite == http-off ]] && http http-off "$RELEASE" --kv-canary none --port 30010
        [[ $suite == http || $suite == http-ours ]] && http http-ours "$OURS" --kv-canary log --port 30011
        [[ $suite == http || $suite == http-upstream ]] && http http-upstream "$RELEASE" --kv-canary log --port 30012
        ;;
    deploy)
        # Where users deploy, correctness: FlashInfer's attention on MHA and MLA, clean and perturbed; the HTTP
        # server (ours) with every perturbation armed, under bench_serving. Engines share the GPU.
        for layout in mha mla; do
            run "fi-$layout-clean" "$OURS" correctness --layout "$layout" --attention-backend flashinfer \
                --decode-steps 1000 --mem-fraction 0.9 &
            run "fi-$layout-perturb" "$OURS" correctness --layout "$layout" --attention-backend flashinfer \
                --perturb 0.02 --kv-canary-sweep-interval 16 --decode-steps 1000 --mem-fraction 0.9 &
        done
        http http-ours-perturb "$OURS" --kv-canary log --perturb 0.02 --port 30020 --rates 32 inf \
            --max-total-tokens 65536 --mem-fraction 0.9 &
        wait
        ;;
    mtp)
        # Multi-layer EAGLE (Step-3.5's three MTP layers, one draft runner per step; the drafts attend with
        # FlashInfer, serve.py says why), clean and perturbed, at once; watched (MTP_LIMIT seconds, default 480: a
        # run still going then has its stacks dumped into its log).
        watched mtp-clean "$OURS" "${MTP_LIMIT:-480}" correctness --layout mtp --decode-steps 1000 --mem-fraction 0.9 &
        watched mtp-perturb "$OURS" "${MTP_LIMIT:-480}" correctness --layout mtp --perturb 0.02 \
            --kv-canary-sweep-interval 16 --decode-steps 1000 --mem-fraction 0.9 &
        wait
        ;;
    tp2)
        # Tensor parallel on two GPUs of one host (nvidia-h200-x2): MHA and MLA, clean and perturbed, at once; each
        # rank runs its own canary manager, and the lowest rank logs the ranks' combined line.
        for layout in mha mla; do
            run "tp2-$layout-clean" "$OURS" correctness --layout "$layout" --tp 2 --decode-steps 1000 \
                --mem-fraction 0.4 &
            run "tp2-$layout-perturb" "$OURS" correctness --layout "$layout" --tp 2 --perturb 0.02 \
                --kv-canary-sweep-interval 16 --decode-steps 1000 --mem-fraction 0.4 &
        done
        wait
        ;;
    profile|profile-1b)
        # Where the canary's time goes in a decode step (profile_step.py): Llama-3-8B (profile-1b: Llama-3.2-1B,
        # whose step is a few ms) at 1 x 1k and at 8 x 1k (PROFILE_BATCHES picks others), sglang's own profiler over
        # 64 decode steps, canary off then ours, about a minute each. The traces (tens of MB) stay on the machine;
        # the archive keeps each way's log and summary.json (a batch other than 1 names its shape:
        # profile-log-8x1024). Batch 1 with Python stacks (the canary's host time); other batches without
        # (--no-stack): with them, ours' step at 8 requests waited on the profiled host, so its device time was of
        # another step than the timed one's.
        model=llama3-8b; [ "$suite" = profile-1b ] && model=llama3.2-1b
        for batch in ${PROFILE_BATCHES:-1 8}; do
            shape=""; stack=(); [ "$batch" = 1 ] || { shape=-${batch}x1024; stack=(--no-stack); }
            for way in none log; do
                path=$RELEASE; [ $way = log ] && path=$OURS
                PYTHONPATH=$path timeout 280 python3 bench/sglang_server/profile_step.py run \
                    --out "$WORK/traces/$model" --model $model --kv-canary $way --batch "$batch" "${stack[@]}" \
                    >"$RUNS/profile-$way$shape.log" 2>&1
                echo "gpu.sh: $suite-$way$shape exit $? ($(date +%T))"
                cp "$WORK/traces/$model/$way-${batch}x1024/summary.json" "$RUNS/profile-$way$shape.summary.json" \
                    2>/dev/null
            done
        done
        ;;
    flood)
        # A bug that corrupts what every request reads at every step (bugs.py decode_table_shift), served
        # with ours, against the same workload clean. The first engine on a machine compiles the canary's
        # kernels (Triton's cache then holds them): a warm-up engine, beside the same bug in raise mode (no
        # timing). Then a clean and a flood engine at once, twice: each pair shares whatever the machine
        # does meanwhile, so a pair's serving times compare where engines run minutes apart differ by more
        # than the 10 % bar (the 2026-11-28 run).
        shift_ours=$(buggy decode_table_shift-ours decode_table_shift "$WORK/ours")
        [ -n "$shift_ours" ] || exit 2
        flood=(correctness --layout mha --decode-steps 3000 --mem-fraction 0.9)
        watched flood-warmup "$OURS" 300 "${flood[@]}" &
        watched raise-bug "$shift_ours:$REPO:$WORK/site" 300 "${flood[@]}" --kv-canary raise &
        wait
        for again in "" -again; do
            watched "flood-clean$again" "$OURS" 300 "${flood[@]}" &
            watched "flood-bug$again" "$shift_ours:$REPO:$WORK/site" 300 "${flood[@]}" &
            wait
        done
        ;;
    stall)
        # Each batch bucket first reached in an eager decode (serve.py stall): ours and canary off, each with an
        # empty Triton cache (a machine that never compiled anything), then ours again with its cache kept.
        for way in ours off ours-cached; do
            path=$OURS; extra=(); [ $way = off ] && { path=$RELEASE; extra=(--kv-canary none); }
            export TRITON_CACHE_DIR=$WORK/triton-${way%-cached}
            [ $way = ours-cached ] || rm -rf "$TRITON_CACHE_DIR"
            run "stall-$way" "$path" stall "${extra[@]}"
        done
        unset TRITON_CACHE_DIR
        ;;
    attrib)
        # Every perturbation kind on MHA, MLA, SWA and EAGLE (the attribution table), beside the hang probe:
        # the radix prefix-match bug served three ways with the idle sweep on, each run watched (watch.py).
        for layout in mha mla swa eagle; do
            run "$layout-perturb" "$OURS" correctness --layout "$layout" --perturb 0.02 --kv-canary-sweep-interval 16 \
                --decode-steps 1000 --mem-fraction 0.9 &
        done
        ours=$(buggy radix_match_short-ours radix_match_short "$WORK/ours")
        release=$(buggy radix_match_short-release radix_match_short "$WORK/site")
        [ -n "$ours" ] && [ -n "$release" ] || exit 2
        probe=(correctness --layout mha --decode-steps 1000 --mem-fraction 0.9)
        watched hang.ours "$ours:$REPO:$WORK/site" 420 "${probe[@]}" --kv-canary-sweep-interval 16 &
        watched hang.upstream "$release:$WORK/site" 420 "${probe[@]}" --kv-canary-sweep-interval 16 &
        watched hang.off "$release:$WORK/site" 420 "${probe[@]}" --kv-canary none &
        wait
        ;;
    corpus1|corpus2)
        # Each bug of the suite's half of the corpus (bugs.py) served three ways at once: ours (log),
        # sglang's own canary (log), canary off. Every run is watched (watch.py): a hang is dumped and killed.
        [ "$suite" = corpus1 ] && corpus=(decode_table_shift radix_match_short radix_split_reversed) \
            || corpus=(radix_evict_locked_parent radix_insert_frees_new allocator_free_neighbour)
        common=(correctness --layout mha --decode-steps 1500 --mem-fraction 0.9)
        for bug in "${corpus[@]}"; do
            three_ways "$bug" "${common[@]}"
        done
        if [ "$suite" = corpus2 ]; then  # FlashInfer's attention (its JIT builds with the image's nvcc), clean
            watched fi-mha-clean "$OURS" 480 correctness --layout mha --attention-backend flashinfer \
                --decode-steps 1500 --mem-fraction 0.9 &
        fi
        wait
        ;;
    corpus3)
        # The corpus's bugs beyond MHA's plain path, each served three ways at once with the layout or feature
        # it needs: SWA translation (gpt-oss), EAGLE accept and free, HiCache load-back, and the prefill table.
        # eagle_release_one_early with a 4096-token pool: its doubly freed slots go to the end of a free list that
        # starts with the whole pool, and sglang's leak check raises at the first idle (the end of the first wave);
        # with 16384 tokens the first wave (at most about 12k slots asked) would not reach them; 4096 turn over in it.
        for entry in swa_mapping_shifted:swa prefill_table_stale:mha eagle_accept_one_more:eagle \
                     eagle_release_one_early:eagle-4096 hicache_load_reversed:mha-hicache; do
            bug=${entry%%:*}; layout=${entry#*:}; extra=()
            [ "$layout" = mha-hicache ] && { layout=mha; extra=(--hicache); }
            [ "$layout" = eagle-4096 ] && { layout=eagle; extra=(--pool-tokens 4096); }
            three_ways "$bug" correctness --layout "$layout" --decode-steps 1000 --mem-fraction 0.9 "${extra[@]}"
        done
        wait
        ;;
    corpus4)
        # The radix cache's eviction and insert bugs again, where they are reached, each three ways at once.
        # radix_insert_frees_new: the correctness waves with a 4096-token pool, so the cache evicts in every wave.
        # radix_evict_locked_parent: serve.py evict (the waves never made its moment, with 16384 or 4096 tokens):
        # a request decodes over its locked prompt node, a finished one hangs a child under it, cached prompts
        # fill the pool, and one chunk-sized prefill (half the 4096-token pool) evicts the child and, with the
        # bug, the locked node, whose slots it then takes.
        three_ways radix_evict_locked_parent evict --pool-tokens 4096 --mem-fraction 0.9
        three_ways radix_insert_frees_new correctness --layout mha --decode-steps 1500 --pool-tokens 4096 \
            --mem-fraction 0.9
        wait
        ;;
    cost-a|cost-1b-a)
        # One engine at a time (two calls of at most 10 minutes): off and ours here, then sglang's own, off
        # again and ours again in cost-b: how far two engines of the same code differ, and the bar judged on the
        # faster engine of each (report.py). cost-1b-*: the same with Llama-3.2-1B, whose step is a few ms.
        model=llama3-8b; [[ $suite == cost-1b-* ]] && model=llama3.2-1b
        run off "$RELEASE" cost --model $model --kv-canary none
        run ours "$OURS" cost --model $model --kv-canary log
        ;;
    cost-b|cost-1b-b)
        model=llama3-8b; [[ $suite == cost-1b-* ]] && model=llama3.2-1b
        run upstream "$RELEASE" cost --model $model --kv-canary log
        run off-again "$RELEASE" cost --model $model --kv-canary none
        run ours-again "$OURS" cost --model $model --kv-canary log
        ;;
    cost-c|cost-1b-c)
        # The instrumented copy with the canary off: how far the instrumented code alone moves the step from the
        # unmodified release's (a graph captured with other code can land in another memory layout).
        model=llama3-8b; [[ $suite == cost-1b-* ]] && model=llama3.2-1b
        run ours-none "$OURS" cost --model $model --kv-canary none
        ;;
    cost-turns|cost-1b-turns)
        # The engines of the cost comparison alive at once on the GPU, measured in turns (turns.py): each rep of
        # each shape on every engine before any runs its next, so a drift of the machine during the call lands on
        # all of them alike (an engine's own slow stretch it does not remove). Each caps its pool (--pool-tokens:
        # the largest shape's 256 x 1233 tokens, and some) so that all fit: four engines of the 1B (canary off,
        # ours, sglang's own, ours' copy with the canary off), two of the 8B (off and ours).
        if [ $suite = cost-1b-turns ]; then model=llama3.2-1b; ways=(off ours upstream ours-none); pool=400000
        else model=llama3-8b; ways=(off ours); pool=330000; fi
        echo 0 > "$WORK/$suite.turns"
        for i in "${!ways[@]}"; do
            way=${ways[$i]}; path=$RELEASE; canary=log
            [[ $way == ours* ]] && path=$OURS
            [[ $way == off || $way == ours-none ]] && canary=none
            run "$way" "$path" cost --model $model --kv-canary $canary --reps 8 --pool-tokens $pool \
                --turns "$WORK/$suite.turns" --turn "$i/${#ways[@]}" &
        done
        wait
        ;;
    *)
        echo "gpu.sh: unknown suite $suite" >&2
        exit 2
        ;;
    esac
    if [ -z "$TAG" ]; then
        tar -C "$WORK/runs" -czf "$DEST/$group.tar.gz" "$group"
    else  # another release's archive and the suite folder in it carry its name: report.py keeps it apart
        tar -C "$WORK/runs" -czf "$DEST/$TAG-$group.tar.gz" --transform "s|^$group|$TAG-$group|" "$group"
    fi
done
