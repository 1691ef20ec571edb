#!/usr/bin/env bash
# Self-contained install check: build the wheel from a copy of the checkout, install it into a
# clean virtualenv outside the checkout (dependencies from the package index or pip's cache; no
# optional extras), check that edge-fleet and a camera config name the missing extras, run
# `edge-agent run` on its embedded defaults from an empty directory outside the checkout, and
# pass on its first ALERT line.
#
# Usage: bash tests/packaging/wheel_check.sh [--build-only | --unit-tests] [WORK_DIR]
#   --build-only only step 1: build the wheel into WORK_DIR/dist (tests/packaging/test_wheel.py)
#   --unit-tests install the wheel with its test extra and, after the run to the first alert,
#                run the checkout's unit tests (tests/unit) on the venv's interpreter: CI's
#                check of another Python version (.ci/run: Python 3.10). The tests import the
#                checkout's sources (PYTHONPATH, also for the agents they start) with the
#                wheel's dependencies; the run to the first alert uses the installed wheel only.
#   WORK_DIR     scratch directory (default: a new mktemp -d, removed at the end); the built
#                wheel is left in WORK_DIR/dist when WORK_DIR is given.
#   PYTHON       interpreter for the build and the venv (default python3)
#   ALERT_WAIT_S bound on the wait for the first ALERT line (default 180; the first alert
#                comes about 30 s after start at the simulator's default speed)
# Exit status: 0 on an ALERT line (and passing unit tests with --unit-tests); 1 on any failure
# (build, install, no alert in time, the agent exiting early, a failing test), with the agent's
# output printed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-python3}
wait_s=${ALERT_WAIT_S:-180}

build_only=0
unit_tests=0
if [[ "${1:-}" == "--build-only" ]]; then
    build_only=1
    shift
elif [[ "${1:-}" == "--unit-tests" ]]; then
    unit_tests=1
    shift
fi
if [[ $# -ge 1 ]]; then
    work=$(mkdir -p "$1" && cd "$1" && pwd)
    keep=1
else
    work=$(mktemp -d /tmp/edge-agent-wheel.XXXXXX)
    keep=0
fi
case "${work}/" in
    "${repo}/"*) echo "WORK_DIR must be outside the checkout ${repo}" >&2; exit 1 ;;
esac

agent_pid=""
cleanup() {
    if [[ -n "${agent_pid}" ]] && kill -0 "${agent_pid}" 2>/dev/null; then
        kill -TERM "${agent_pid}" 2>/dev/null || true
        wait "${agent_pid}" 2>/dev/null || true
    fi
    if [[ ${keep} -eq 0 ]]; then rm -rf "${work}"; fi
}
trap cleanup EXIT

# Nothing from the checkout may leak into the installed agent.
unset PYTHONPATH EDGE_AGENT_MODELS_DIR
export PIP_DISABLE_PIP_VERSION_CHECK=1

# 1. Build from a copy of the tracked and new (not ignored) files: a stale build/ of the
#    checkout never ends up in the wheel.
src="${work}/src"
rm -rf "${src}" "${work}/dist"
mkdir -p "${src}" "${work}/dist"
if git -C "${repo}" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "${repo}" && git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [[ -e "${f}" ]] && printf '%s\0' "${f}"; done \
        | tar --null -T - -cf -) | tar -xf - -C "${src}"
else
    cp -a "${repo}/." "${src}/"
fi
"${python}" -m pip wheel --quiet --no-deps -w "${work}/dist" "${src}"
wheel=$(ls "${work}"/dist/*.whl)
echo "built $(basename "${wheel}") ($(du -k "${wheel}" | cut -f1) KiB)"
rm -rf "${src}"
if [[ ${build_only} -eq 1 ]]; then exit 0; fi

# 2. A clean virtualenv outside the checkout, the wheel and its install_requires only (and the
#    test extra with --unit-tests).
venv="${work}/venv"
"${python}" -m venv "${venv}"
"${venv}/bin/python" --version
if [[ ${unit_tests} -eq 1 ]]; then
    "${venv}/bin/python" -m pip install --quiet "${wheel}[test]"
else
    "${venv}/bin/python" -m pip install --quiet "${wheel}"
fi
(cd "${work}" && "${venv}/bin/python" - "${repo}") <<'EOF'
import sys
from pathlib import Path

import agent
from agent.config.schema import resolve_model_path

repo = Path(sys.argv[1])
where = Path(agent.__file__).resolve()
model = resolve_model_path("builtin:skab-wstat", Path.cwd())
print(f"agent imported from {where.parent}; builtin:skab-wstat -> {model}")
if where.is_relative_to(repo) or model.is_relative_to(repo):
    sys.exit(f"the installed agent reads the checkout {repo}")
EOF

(cd "${work}" && "${venv}/bin/edge-agent" models)

# 2b. What a gateway install lacks is named with the wheel's install command, not a traceback:
#     edge-fleet without the fleet extra (one line, exit 69), a camera config without the
#     camera extra (check-config: a problem, exit 78). Skipped when the venv has the module.
if ! "${venv}/bin/python" -c 'import sqlalchemy' 2>/dev/null; then
    (cd "${work}" && "${venv}/bin/edge-fleet" device list) >"${work}/fleet.out" 2>&1 \
        && rc=0 || rc=$?
    if [[ ${rc} -ne 69 ]] || [[ $(wc -l <"${work}/fleet.out") -ne 1 ]] \
        || ! grep -q "^edge-fleet needs the fleet extra: pip install 'edge-anomaly-agent\[fleet\]'" \
            "${work}/fleet.out"; then
        echo "edge-fleet without the fleet extra: expected one line and exit 69, got ${rc}:" >&2
        cat "${work}/fleet.out" >&2
        exit 1
    fi
    echo "edge-fleet without the fleet extra: $(cat "${work}/fleet.out")"
fi
if ! "${venv}/bin/python" -c 'import cv2' 2>/dev/null; then
    mkdir -p "${work}/camera/frames"
    # (the wheel ships no image model: its default sensor model is a second problem here)
    printf '[[streams]]\nname = "cam1"\n[streams.source]\nkind = "camera"\nfolder = "frames"\n' \
        >"${work}/camera/agent.toml"
    (cd "${work}/camera" && "${venv}/bin/edge-agent" check-config agent.toml) \
        >"${work}/camera.out" 2>&1 && rc=0 || rc=$?
    if [[ ${rc} -ne 78 ]] || ! grep -q "OpenCV is not installed.*pip install 'edge-anomaly-agent\[camera\]'" \
            "${work}/camera.out"; then
        echo "check-config of a camera config without OpenCV: expected exit 78 naming it, got ${rc}:" >&2
        cat "${work}/camera.out" >&2
        exit 1
    fi
    echo "check-config without the camera extra: $(grep -m1 OpenCV "${work}/camera.out")"
fi

# 3. `edge-agent run` on the embedded defaults, from an empty directory outside the checkout.
run_dir="${work}/run"
mkdir -p "${run_dir}"
log="${work}/agent.log"
(cd "${run_dir}" && exec "${venv}/bin/edge-agent" run) >"${log}" 2>&1 &
agent_pid=$!
start=${SECONDS}
while ! grep -q '^ALERT ' "${log}"; do
    if ! kill -0 "${agent_pid}" 2>/dev/null; then
        wait "${agent_pid}" && rc=0 || rc=$?
        agent_pid=""
        echo "edge-agent run exited (status ${rc}) before its first ALERT line:" >&2
        cat "${log}" >&2
        exit 1
    fi
    if (( SECONDS - start >= wait_s )); then
        echo "no ALERT line within ${wait_s} s; the agent printed:" >&2
        cat "${log}" >&2
        exit 1
    fi
    sleep 1
done
echo "first ALERT after $((SECONDS - start)) s:"
grep -m1 '^ALERT ' "${log}"
kill -TERM "${agent_pid}"
wait "${agent_pid}" && rc=0 || rc=$?
agent_pid=""
if [[ ${rc} -ne 0 ]]; then
    echo "edge-agent run exited with status ${rc} on SIGTERM:" >&2
    cat "${log}" >&2
    exit 1
fi
echo "wheel check passed"

# 4. With --unit-tests: the unit suite on this interpreter (not the integration suite: CI time).
if [[ ${unit_tests} -eq 1 ]]; then
    tests_start=${SECONDS}
    # PYTHONPATH: the agents some tests start as subprocesses import the checkout too (the
    # checkout's models/, e.g. the image package the wheel does not hold)
    (cd "${repo}" && PYTHONPATH=${repo} "${venv}/bin/python" -m pytest -q -p no:cacheprovider \
        -n "${PYTEST_WORKERS:-2}" tests/unit)
    echo "unit tests on $("${venv}/bin/python" --version) passed in $((SECONDS - tests_start)) s"
fi
