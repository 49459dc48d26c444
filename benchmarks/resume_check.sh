#!/usr/bin/env bash
# Kill a `distillery compress` run with SIGKILL during student training, resume it, and compare the
# final student with an uninterrupted run of the same settings (same machine, same thread count).
#   benchmarks/resume_check.sh REFERENCE_RUN_FOLDER [DATA_DIR]
# REFERENCE_RUN_FOLDER: a finished run with default settings (e.g. the one `make demo` wrote).
set -euo pipefail
ref=$1; data=${2:-../shared/data}; out=runs/resume-check
bin=$(dirname "$0")/../.venv/bin
rm -rf "$out"
"$bin/distillery" compress --data-dir "$data" --out "$out" > /tmp/resume-check-1.log 2>&1 &
pid=$!
# wait for the student's first checkpoint, let it train on a while, then kill it hard
until [ -f "$out/checkpoints/last/trainer_state.json" ]; do sleep 2; kill -0 $pid || exit 1; done
sleep 30
kill -9 $pid; wait $pid 2>/dev/null || true
echo "killed at: $(python3 -c "import json;print(json.load(open('$out/checkpoints/last/trainer_state.json'))['global_step'])") (last checkpoint step)"
"$bin/distillery" compress --out "$out" --resume > /tmp/resume-check-2.log 2>&1
"$bin/python" - "$ref/student/model.safetensors" "$out/student/model.safetensors" <<'PY'
import sys, torch
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys()
worst = max((x - b[k]).abs().max().item() for k, x in a.items())
print(f"{len(a)} tensors; largest absolute difference to the uninterrupted run: {worst:.3g}")
sys.exit(0 if worst <= 1e-6 else 1)
PY
