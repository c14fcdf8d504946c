#!/usr/bin/env bash
# The checks that need the lent GPU / many-core machine, in one prepared call (bench/history.md).
#
# That machine has its own Python (3.12, a CUDA torch, torchvision) and no package index: the
# packages it lacks travel as wheels in .whl/ (see the download command in bench/history.md).
# Each step has its own time limit, so one that hangs still leaves the others' figures. Logs and
# JSON go to $OUT (or bench/out/device when run by hand).
#
#   bench/device_check.sh [STEP ...]   # steps: cuda gpu throughput scaling imagenet (default), decode jpeg4 views
#
# Wheels (here, for the machine's Python 3.12): pyarrow and the server extras into .whl/ (installed
# under /tmp/site); nvidia-nvimgcodec-cu13 + nvidia-nvjpeg into .whl2/ (a second call: both sets
# together pass the 64 MiB a call carries), then `decode` measures the trainer decode with it.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/device}
LOGS=$(mktemp -d)
mkdir -p "$OUT" bench/out
if compgen -G ".whl/*.whl" > /dev/null && [ ! -d /tmp/site/pyarrow ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site  # also on a second call to a warm machine
if compgen -G ".whl2/*.whl" > /dev/null; then  # into the machine's own site: nvidia/ is a regular package there
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl2/*.whl || exit 1
fi
# the HDF5 reader registers hdf5plugin's filters on import; the bench files are gzip (built into
# HDF5), so where the machine lacks the package and no wheel travelled, an empty stand-in will do
if ! PYTHONPATH=${PYTHONPATH:-} python3 -c "import hdf5plugin" 2> /dev/null; then
    mkdir -p /tmp/site && echo "# stand-in (bench/device_check.sh): gzip needs no plugin" > /tmp/site/hdf5plugin.py
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/server:$PWD/client:$PWD/proto_schemas:$PWD"
export PYTHONUNBUFFERED=1
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(cuda gpu throughput scaling imagenet)
log="$OUT/device.log"
{
    date -u; nproc; free -g | head -2; nvidia-smi -L 2>&1
    python3 -c "import sys, pyarrow, torch, numpy; print(sys.version.split()[0], 'pyarrow', pyarrow.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available())"
} > "$log" 2>&1
run() {  # run NAME LIMIT_S CMD...: the command's output in $OUT/NAME.log, a summary line in device.log
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "== $name: $*" >> "$log"
    timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s, load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$log"
    tail -n 25 "$LOGS/$name.log" >> "$log"
}
for step in "${steps[@]}"; do
    case $step in
        cuda) run cuda 90 python3 -m pytest -m cuda -q -p no:cacheprovider -o addopts="" \
                  tests/client/test_client_cuda.py tests/transforms/test_trainer_decode.py \
                  tests/transforms/test_jpeg_decoders.py -rs ;;
        gpu) run gpu 150 python3 bench/bench_gpu.py --rounds 3 --streams 8 --steps 60 ;;
        throughput) run throughput 90 python3 bench/bench_throughput.py --streams 8 --rounds 3 --seed-epochs 0 ;;
        scaling) run scaling 150 python3 bench/bench_scaling.py --rounds 1 --e2e --streams 8 ;;
        imagenet) run imagenet 170 python3 bench/bench_imagenet.py --images 4000 --server-workers 0 \
                      --streams 8 --rounds 1 --batch-size 128 --epochs 2 ;;
        decode) run decode 150 python3 bench/bench_imagenet.py --images 4000 --streams 8 --rounds 1 \
                    --batch-size 128 --epochs 2 --only d_trainer_decode_product d_gpu_decode_train
                cp bench/out/imagenet_only.json "$OUT/decode.json" ;;
        jpeg4) run jpeg4 120 python3 bench/bench_imagenet.py --images 4000 --server-workers 4 --streams 8 \
                   --rounds 1 --batch-size 128 --epochs 2 --only a_seed_recipe_train b_flightfeed_train
               cp bench/out/imagenet_only.json "$OUT/jpeg4.json" ;;
        views) run views 240 python3 bench/bench_views.py --streams 8 --rounds 3 --gb 1 --floor-gib 0.5 ;;
        *) echo "unknown step $step" >> "$log" ;;
    esac
done
for f in gpu throughput scaling imagenet views; do
    [ -f "bench/out/$f.json" ] && cp "bench/out/$f.json" "$OUT/"
done
tar -czf "$OUT/logs.tgz" -C "$LOGS" .  # every step's whole output (the files that come back are few)
ls -la "$OUT" >> "$log"
cat "$log"
