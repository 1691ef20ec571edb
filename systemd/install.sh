#!/usr/bin/env bash
# Install the edge agent (and optionally the fleet service) as systemd services.
#
#   sudo systemd/install.sh [--wheel FILE] [--fleet] [--now] [--dry-run]
#                           [--prefix DIR] [--no-systemctl] [--skip-venv]
#
# What it does, in order (every step is idempotent: running it again upgrades the package and
# refreshes models and units, and never overwrites a config or a credential you edited):
#   1. venv /opt/edge-agent/venv (python3 -m venv), then pip install the package: from --wheel
#      FILE, else from this repository checkout (non-editable); --fleet adds the [fleet] extra;
#   2. system user and group edge-agent (home /var/lib/edge-agent, no login shell), member of
#      dialout (serial ports) and video (cameras); --fleet: user edge-fleet;
#   3. models/ -> /opt/edge-agent/models (the unit sets EDGE_AGENT_MODELS_DIR to it, so
#      `model = "builtin:<name>"` resolves there), README.md -> /opt/edge-agent/README.md;
#   4. /etc/edge-agent/agent.toml from systemd/agent.example.toml when absent (0640 root:edge-agent),
#      /etc/edge-agent/credentials/{mqtt-password,fleet-token} created empty (0600 root) when
#      absent: LoadCredential= needs the files to exist; put the secrets in them;
#   5. units -> /etc/systemd/system (edge-agent.service; --fleet: edge-fleet.service and
#      /etc/edge-fleet/credentials/admin-token), systemctl daemon-reload, enable (--now: start).
#
# Options:
#   --dry-run       print every command, change nothing
#   --prefix DIR    install under DIR instead of / (tests, images); skips users and chown
#   --no-systemctl  do not run systemctl (chroots, image builds, tests)
#   --skip-venv     do not create the venv or run pip (tests; the venv is managed elsewhere)
#   --wheel FILE    install this wheel instead of the checkout
#   --fleet         also install the fleet service
#   --now           start (or restart) the services after enabling them
# Exit: 0 done, 2 bad arguments, 1 a step failed (set -e: the failing command is printed).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dry_run=0
prefix=""
systemctl_on=1
venv_on=1
wheel=""
fleet=0
start_now=0

usage() { sed -n '2,33p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while (($#)); do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --prefix) prefix=${2:?--prefix needs a directory}; shift ;;
        --no-systemctl) systemctl_on=0 ;;
        --skip-venv) venv_on=0 ;;
        --wheel) wheel=${2:?--wheel needs a file}; shift ;;
        --fleet) fleet=1 ;;
        --now) start_now=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
if [[ -n "${prefix}" ]]; then
    prefix=$(realpath -m "${prefix}")
fi

opt="${prefix}/opt/edge-agent"
etc="${prefix}/etc/edge-agent"
units="${prefix}/etc/systemd/system"
venv="${opt}/venv"

# Print a command; run it unless --dry-run.
run() {
    echo "+ $*"
    if ((!dry_run)); then "$@"; fi
}

# Install a file only when the target does not exist yet (configs and secrets are the user's).
install_once() {
    local mode=$1 group=$2 src=$3 dst=$4
    if [[ -e "${dst}" ]]; then
        echo "= keep ${dst} (exists)"
        return
    fi
    if [[ -n "${prefix}" ]]; then group=""; fi
    if [[ -n "${src}" ]]; then
        run install -D -m "${mode}" ${group:+-g "${group}"} "${src}" "${dst}"
    else
        run install -D -m "${mode}" ${group:+-g "${group}"} /dev/null "${dst}"
    fi
}

ensure_user() {
    local user=$1 home=$2 groups=$3
    if [[ -n "${prefix}" ]]; then
        echo "= skip user ${user} (--prefix)"
        return
    fi
    if id -u "${user}" >/dev/null 2>&1; then
        echo "= keep user ${user} (exists)"
    else
        run useradd --system --user-group --home-dir "${home}" --no-create-home \
            --shell /usr/sbin/nologin "${user}"
    fi
    local g
    for g in ${groups}; do
        if getent group "${g}" >/dev/null 2>&1; then
            run usermod --append --groups "${g}" "${user}"
        fi
    done
}

echo "== edge-agent install from ${repo} into ${prefix:-/}$( ((dry_run)) && echo ' (dry run)')"

echo "-- 1. venv and package"
if ((venv_on)); then
    if [[ -x "${venv}/bin/python" ]]; then
        echo "= keep venv ${venv} (exists)"
    else
        run python3 -m venv "${venv}"
    fi
    target=${wheel:-${repo}}
    if ((fleet)); then target="${target}[fleet]"; fi
    run "${venv}/bin/python" -m pip install --disable-pip-version-check --upgrade "${target}"
else
    echo "= skip venv (--skip-venv)"
fi

echo "-- 2. users"
ensure_user edge-agent /var/lib/edge-agent "dialout video"
if ((fleet)); then ensure_user edge-fleet /var/lib/edge-fleet ""; fi

echo "-- 3. models"
run mkdir -p "${opt}"
run rm -rf "${opt}/models.new"
run cp -r "${repo}/models" "${opt}/models.new"
run rm -rf "${opt}/models"
run mv "${opt}/models.new" "${opt}/models"
run install -m 0644 "${repo}/README.md" "${opt}/README.md"

echo "-- 4. config and credentials"
install_once 0640 edge-agent "${repo}/systemd/agent.example.toml" "${etc}/agent.toml"
install_once 0600 "" "" "${etc}/credentials/mqtt-password"
install_once 0600 "" "" "${etc}/credentials/fleet-token"
if ((fleet)); then
    install_once 0600 "" "" "${prefix}/etc/edge-fleet/credentials/admin-token"
fi

echo "-- 5. units"
services=(edge-agent.service)
if ((fleet)); then services+=(edge-fleet.service); fi
for unit in "${services[@]}"; do
    run install -D -m 0644 "${repo}/systemd/${unit}" "${units}/${unit}"
done
if ((systemctl_on)); then
    run systemctl daemon-reload
    run systemctl enable "${services[@]}"
    if ((start_now)); then run systemctl restart "${services[@]}"; fi
else
    echo "= skip systemctl (--no-systemctl)"
fi

echo "== done. Next: edit ${etc}/agent.toml, put secrets in ${etc}/credentials/, then"
echo "   edge-agent check-config ${etc}/agent.toml && systemctl restart edge-agent"
echo "   edge-agent status --config ${etc}/agent.toml"
