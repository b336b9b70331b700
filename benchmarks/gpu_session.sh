#!/usr/bin/env bash
# The GPU check on a lent GPU machine (issue #29; /work/shared/GPU.md): run this first in a session that
# has a GPU. One device command runs at most 10 minutes, a machine idle for 30 s goes back bare, and the
# device time a session gets has changed (30 minutes, then 15 from 2026-11-28, the start included), so the
# check runs in parts, each one self-contained (wheels, data, measurement) and each writing its part under
# $OUT; the parts are merged here afterwards.
#
# With 15 minutes (one start, one call of under 10 minutes, a few minutes to spare):
#   bash benchmarks/gpu_session.sh first      # the GPU tests while the HPC datasets are written, the peak,
#                                             # then oc20, deepcam, cosmoflow (BUDGET_S seconds, default 520)
#   as one `run` with carry [".whl"] and timeout_s 580, then give_back; back here `merge` the folder it
#   returned. A second call (`training`, BUDGET_S set to what is left) only if the machine is still warm:
#   on 2026-11-28 the H200 started in about 30 s, and new loans were paused right after the first call.
#   That first call (before gpu_check bounded compilation and wrote as it went) was cut off inside
#   DeepCAM's third compilation and lost its HPC JSON: benchmarks/results/gpu_check_2026-11-28_h200_partial.txt.
#
# Once, on the development machine, in the repository root (the wheels the GPU node lacks, GPU.md):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl zstandard==0.25.0 lmdb==3.0.0 mlperf-logging==4.1.68 crc32c==2.9.post0 tomli-w==1.2.0 ase==3.29.0 \
#     simplejpeg==1.9.0
#   (the versions of the project's .venv; where pip finds no wheel for a platform tag, add
#   --platform manylinux_2_N_x86_64 for the N it names. GPU.md: the first six were enough there on
#   2026-11-23; simplejpeg, the ResNet readers' strict JPEG decode, came after.)
# With 30 minutes: three device calls, each `run` with carry [".whl"] and timeout_s 600:
#   bash benchmarks/gpu_session.sh tests      # the GPU test files, counted, and the bf16 GEMM peak
#   bash benchmarks/gpu_session.sh hpc        # oc20, deepcam, cosmoflow at NVIDIA's local batches
#   bash benchmarks/gpu_session.sh training   # every other registered workload (training suite, new ones)
# and, back here, with the three folders the calls returned (files_at):
#   bash benchmarks/gpu_session.sh merge DIR1 DIR2 DIR3   # -> benchmarks/results/gpu_check_<date>_<device>.txt/.json
# Do not bring the mpich or mpi4py wheels: the system Open MPI's mpiexec is the launcher there.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?usage: gpu_session.sh first|tests|hpc|training|merge DIR...}
out=${OUT:-benchmarks/results/gpu_parts}
py=${PYTHON:-python3}

if [ "$part" = merge ]; then
    shift
    [ "$#" -gt 0 ] || { echo "gpu_session.sh merge: name the folders the device calls returned" >&2; exit 2; }
    parts=()
    for d in "$@"; do parts+=("$d"/gpu_check_part-*.json); done
    dev=$("$py" -c "import json,re,sys; l=json.load(open(sys.argv[1]))['device_line']; m=re.match(r'# GPU (?:NVIDIA )?([A-Za-z0-9]+)', l); print(m.group(1).lower() if m else 'cpu')" "${parts[0]}")
    day=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1])).get('date', ''))" "${parts[0]}")
    exec "$py" -m benchmarks.gpu_check --merge "${parts[@]}" --out "benchmarks/results/gpu_check_${day:-$(date +%F)}_${dev}"
fi

case "$part" in
    first|tests|hpc|training) ;;
    *) echo "gpu_session.sh: unknown part '$part' (first, tests, hpc, training, merge)" >&2; exit 2 ;;
esac
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$out"
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$out/nvidia-smi_$part.csv" 2>&1 || true
# the least measured first: OC20 (item 2's goal, never measured against NVIDIA's figures), then DeepCAM (eager
# only so far), then CosmoFlow (every mode measured on the H200 on 2026-11-28); each gets an equal share of
# what is left, so a workload cut off early leaves its time to the next. HPC=... chooses others.
hpc=${HPC:-oc20,deepcam,cosmoflow}
work=/tmp/hpcbench-gpu-check
if [ "$part" = first ]; then
    # the datasets are written by the check's own datagen (its .done markers), on the CPU, while the tests
    # run; the tests' timings are not figures, and the workloads start only once both are done
    budget=${BUDGET_S:-520}
    names=(${hpc//,/ }) pids=()
    for w in "${names[@]}"; do
        "$py" -c "import sys; from pathlib import Path; from benchmarks.gpu_check.cli import datagen; \
from benchmarks.gpu_check.plan import plan_for; datagen(plan_for(sys.argv[1]), Path(sys.argv[2]) / sys.argv[1], False, 400)" \
            "$w" "$work" > "/tmp/datagen-$w.log" 2>&1 &
        pids+=($!)
    done
    "$py" -m benchmarks.gpu_check --tests gpu --test-workers 8 --no-workloads --budget-s 150 --work "$work" \
        --out "$out/gpu_check_part-tests" 2>&1 | tee "$out/gpu_check_part-tests.log" || true
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { echo "datagen ${names[$i]} failed:"; tail -3 "/tmp/datagen-${names[$i]}.log"; }
    done
    left=$((budget - (SECONDS - start)))
    "$py" -m benchmarks.gpu_check --tests none --workloads "$hpc" --seconds 4 --budget-s $((left > 60 ? left : 60)) \
        --work "$work" --out "$out/gpu_check_part-hpc" 2>&1 | tee "$out/gpu_check_part-hpc.log"
    exit 0
fi
case "$part" in
    tests)    args=(--tests gpu --test-workers 4 --no-workloads --budget-s 420) ;;
    hpc)      args=(--tests none --workloads "$hpc" --seconds 5 --budget-s 500) ;;
    training) rest=$("$py" -c "from hpcbench import registry; print(','.join(n for n in registry.names() if n not in ('cosmoflow', 'deepcam', 'oc20')))")
              args=(--tests none --workloads "$rest" --seconds 5 --budget-s "${BUDGET_S:-500}") ;;
esac
"$py" -m benchmarks.gpu_check "${args[@]}" --work "$work" --out "$out/gpu_check_part-$part" 2>&1 \
    | tee "$out/gpu_check_part-$part.log"
