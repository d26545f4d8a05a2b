#!/usr/bin/env bash
# The plugin on real kubelets: build the image, then for each Kubernetes version of the
# matrix create a kind cluster, deploy the DaemonSet, run deploy/pod-example.yml and check
#   - the labelled worker advertises the expected number of b-com.com/accelerator,
#   - the unlabelled control plane advertises none (node selection),
#   - the example pod printed ACCELERATOR_UNITS=<one unit ID>.
#
# Usage:
#   compat_tests/kind/run.sh                      every matrix.txt entry whose kind release
#                                                 matches the installed kind binary
#   compat_tests/kind/run.sh --all                every entry, whatever kind is installed
#   compat_tests/kind/run.sh --node-image IMG [--overlay DIR]   one cluster
#   compat_tests/kind/run.sh --check              only check the prerequisites
# Environment: KEEP_CLUSTERS=1 keeps the clusters, SKIP_BUILD=1 reuses the image,
# EXPECTED_UNITS (default 40, the units backend's ACCELERATOR_DP_ACCEL_NBUNITS),
# KIND_TIMEOUT (default 300: seconds for each rollout or wait).
# Exit status: 0 all passed, 1 a check failed, 2 usage, 77 Docker, kind or kubectl missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
image='k8s-accelerator-devplugin:kind'
expected_units=${EXPECTED_UNITS:-40}
timeout=${KIND_TIMEOUT:-300}
resource='b-com.com/accelerator'
label='accelerators.b-com.com/fpga=true'

current_cluster=""

say() { printf '[kind] %s\n' "$*" >&2; }

cleanup() { # deletes the cluster of the entry that just ran (or was interrupted)
  if [[ -n $current_cluster && ${KEEP_CLUSTERS:-0} != 1 ]]; then
    kind delete cluster --name "$current_cluster" >/dev/null 2>&1 || true
  fi
  current_cluster=""
}

missing_prerequisites() {
  local missing=()
  command -v docker >/dev/null 2>&1 || missing+=("docker (client)")
  if command -v docker >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
    missing+=("a running Docker engine (docker info failed)")
  fi
  command -v kind >/dev/null 2>&1 || missing+=("kind")
  command -v kubectl >/dev/null 2>&1 || missing+=("kubectl")
  if ((${#missing[@]})); then
    printf '%s\n' "${missing[@]}"
  fi
}

wait_until() { # seconds, description, command...
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      say "timed out after ${seconds}s waiting for ${what}"
      return 1
    fi
    sleep 2
  done
}

diagnose() { # context
  local ctx=$1
  say "diagnostics for ${ctx}:"
  kubectl --context "$ctx" get nodes -o wide >&2 || true
  kubectl --context "$ctx" get pods -A -o wide >&2 || true
  kubectl --context "$ctx" -n kube-system describe daemonset accelerator-device-plugin >&2 || true
  kubectl --context "$ctx" -n kube-system logs daemonset/accelerator-device-plugin --tail=100 >&2 || true
  kubectl --context "$ctx" describe pod accelerator-example >&2 || true
}

allocatable() { # context node
  kubectl --context "$1" get node "$2" -o "jsonpath={.status.allocatable.b-com\.com/accelerator}"
}

pod_finished() { # context
  local phase
  phase=$(kubectl --context "$1" get pod accelerator-example -o 'jsonpath={.status.phase}')
  [[ $phase == Succeeded || $phase == Failed ]]
}

run_one() { # node-image overlay-dir
  local node_image=$1 overlay=$2
  local version=${node_image#*:}
  version=${version%%@*}
  local cluster="accel-${version//./-}"
  local ctx="kind-${cluster}"
  local worker="${cluster}-worker"
  say "=== ${node_image} with ${overlay}"
  kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  current_cluster=$cluster
  # run_one is called as an `if` condition, where bash ignores set -e: every step checks.
  kind create cluster --name "$cluster" --image "$node_image" --config "$here/cluster.yaml" --wait "${timeout}s" || return 1
  kind load docker-image "$image" --name "$cluster" || return 1
  kubectl --context "$ctx" label node "$worker" "$label" --overwrite || return 1
  kubectl --context "$ctx" apply -k "$repo/$overlay" || return 1
  if ! kubectl --context "$ctx" -n kube-system rollout status daemonset/accelerator-device-plugin --timeout="${timeout}s"; then
    diagnose "$ctx"
    return 1
  fi
  local scheduled
  scheduled=$(kubectl --context "$ctx" -n kube-system get daemonset accelerator-device-plugin -o 'jsonpath={.status.desiredNumberScheduled}')
  if [[ $scheduled != 1 ]]; then
    say "FAIL: the DaemonSet wants ${scheduled} pods; only the labelled worker should run one"
    diagnose "$ctx"
    return 1
  fi
  if ! wait_until "$timeout" "${worker} to advertise ${expected_units} ${resource}" \
    test "$(allocatable "$ctx" "$worker")" = "$expected_units"; then
    say "FAIL: ${worker} allocatable ${resource} is '$(allocatable "$ctx" "$worker")'"
    diagnose "$ctx"
    return 1
  fi
  local on_control_plane
  on_control_plane=$(allocatable "$ctx" "${cluster}-control-plane")
  if [[ -n $on_control_plane ]]; then
    say "FAIL: the unlabelled control plane advertises ${on_control_plane} ${resource}"
    return 1
  fi
  kubectl --context "$ctx" apply -f "$repo/deploy/pod-example.yml" || return 1
  if ! wait_until "$timeout" "the example pod to finish" pod_finished "$ctx"; then
    diagnose "$ctx"
    return 1
  fi
  local output
  output=$(kubectl --context "$ctx" logs accelerator-example) || return 1
  if [[ ! $output =~ ^ACCELERATOR_UNITS=([0-9]+)$ ]] || ((BASH_REMATCH[1] >= expected_units)); then
    say "FAIL: the example pod printed '${output}', expected ACCELERATOR_UNITS=<0..$((expected_units - 1))>"
    diagnose "$ctx"
    return 1
  fi
  say "PASS ${version}: ${worker} advertises ${expected_units} ${resource}; example pod got ${output}"
}

main() {
  local mode=matrix node_image="" overlay=compat_tests/kind
  while (($#)); do
    case $1 in
      --all) mode=all ;;
      --check) mode=check ;;
      --node-image) node_image=${2:?--node-image needs a value}; mode=one; shift ;;
      --overlay) overlay=${2:?--overlay needs a value}; shift ;;
      -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; return 0 ;;
      *) say "unknown argument $1"; return 2 ;;
    esac
    shift
  done
  local missing
  missing=$(missing_prerequisites)
  if [[ -n $missing ]]; then
    say "kind matrix not run; missing: $(echo "$missing" | paste -sd ';' -)"
    return 77
  fi
  if [[ $mode == check ]]; then
    say "prerequisites present: $(kind version)"
    return 0
  fi
  trap cleanup EXIT
  if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    docker build -f "$repo/Dockerfile.multistage" -t "$image" "$repo"
  fi
  local entries=()
  if [[ $mode == one ]]; then
    entries=("- - ${node_image} ${overlay}")
  else
    local installed
    installed=$(kind version | awk '{print $2}')
    while read -r k8s kind_release img dir; do
      [[ -z $k8s || $k8s == \#* ]] && continue
      if [[ $mode == matrix && $kind_release != "$installed" ]]; then
        say "skip ${k8s}: its node image is built for kind ${kind_release}, this is kind ${installed}"
        continue
      fi
      entries+=("${k8s} ${kind_release} ${img} ${dir}")
    done <"$here/matrix.txt"
  fi
  if ((${#entries[@]} == 0)); then
    say "no matrix entry for this kind release; use --all or --node-image"
    return 1
  fi
  local failed=0 passed=0 entry
  for entry in "${entries[@]}"; do
    read -r _ _ img dir <<<"$entry"
    if run_one "$img" "$dir"; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
    fi
    cleanup
  done
  echo "kind: ${passed} passed, ${failed} failed"
  ((failed == 0))
}

main "$@"
