#!/usr/bin/env bash
# The plugin on real kubelets: build the image, then for each Kubernetes version of the
# matrix create a kind cluster, deploy the DaemonSet, run deploy/pod-example.yml and check
# what the entry's API column says the labelled worker must end up serving.
# device-plugin:
#   - the labelled worker advertises the expected number of b-com.com/accelerator,
#   - the unlabelled control plane advertises none (node selection),
#   - the example pod printed ACCELERATOR_UNITS=<one unit ID>.
# dra (the dra overlay, ACCELERATOR_DP_API=auto, applied as docs/deploying.md says: the
# cluster-wide objects first, then the DaemonSet):
#   - the worker's containerd has CDI on, the DeviceClass kept its extendedResourceName,
#   - the plugin pod logged that it serves the worker through DRA,
#   - ResourceSlices of driver accelerator.b-com.com list the expected number of devices
#     for the worker, and none for the control plane,
#   - neither node advertises b-com.com/accelerator (the plugin chose DRA, not both),
#   - the example pod, still asking for b-com.com/accelerator, printed
#     ACCELERATOR_UNITS=<one unit ID> and has status.extendedResourceClaimStatus (the
#     scheduler served it through DRA).
#
# Usage:
#   compat_tests/kind/run.sh                      every matrix.txt entry whose kind release
#                                                 matches the installed kind binary
#   compat_tests/kind/run.sh --all                every entry, whatever kind is installed
#   compat_tests/kind/run.sh --node-image IMG [--overlay DIR] [--api device-plugin|dra]
#                                                 one cluster (default API: device-plugin)
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
driver='accelerator.b-com.com'             # the DRA driver and its DeviceClass
dra_cluster_objects='deploy/overlays/dra/cluster'

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

diagnose() { # context [api]
  local ctx=$1 api=${2:-device-plugin}
  say "diagnostics for ${ctx}:"
  kubectl --context "$ctx" get nodes -o wide >&2 || true
  kubectl --context "$ctx" get pods -A -o wide >&2 || true
  kubectl --context "$ctx" -n kube-system describe daemonset accelerator-device-plugin >&2 || true
  kubectl --context "$ctx" -n kube-system logs daemonset/accelerator-device-plugin --tail=100 >&2 || true
  kubectl --context "$ctx" describe pod accelerator-example >&2 || true
  if [[ $api == dra ]]; then
    kubectl --context "$ctx" get deviceclasses -o yaml >&2 || true
    kubectl --context "$ctx" get resourceslices -o wide >&2 || true
    kubectl --context "$ctx" get resourceclaims -A -o yaml >&2 || true
  fi
}

allocatable() { # context node
  kubectl --context "$1" get node "$2" -o "jsonpath={.status.allocatable.b-com\.com/accelerator}"
}

pod_finished() { # context
  local phase
  phase=$(kubectl --context "$1" get pod accelerator-example -o 'jsonpath={.status.phase}')
  [[ $phase == Succeeded || $phase == Failed ]]
}

slice_devices() { # context node: how many devices the driver's ResourceSlices list for node
  kubectl --context "$1" get resourceslices --field-selector "spec.nodeName=$2,spec.driver=${driver}" \
    -o 'jsonpath={range .items[*]}{range .spec.devices[*]}{.name}{"\n"}{end}{end}' | grep -c . || true
}

api_choice() { # context node: the last choice of API the plugin logged for node ('' if none)
  kubectl --context "$1" -n kube-system logs daemonset/accelerator-device-plugin --tail=-1 |
    awk -v said="node $2: serving its devices through " \
      'index($0, said) { last = substr($0, index($0, said) + length(said)) } END { print last }'
}

cdi_enabled() { # node container: its containerd's merged config has CDI on, /var/run/cdi read
  local config
  config=$(docker exec "$1" containerd config dump) || return 1
  [[ $config =~ enable_cdi\ *=\ *true && $config == */var/run/cdi* ]]
}

check_device_plugin() { # context cluster worker: the worker serves through the device plugin
  local ctx=$1 cluster=$2 worker=$3
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
}

check_dra() { # context cluster worker: the worker serves through DRA, and only through DRA
  local ctx=$1 cluster=$2 worker=$3 choice
  # The plugin decides once its kubelet answers the DRA registration: wait for that word.
  wait_until "$timeout" "the plugin to choose an API for ${worker}" \
    test -n "$(api_choice "$ctx" "$worker")" || true
  choice=$(api_choice "$ctx" "$worker")
  if [[ $choice != DRA:* ]]; then
    say "FAIL: the plugin serves ${worker} through '${choice:-no API it logged}', expected DRA"
    diagnose "$ctx" dra
    return 1
  fi
  if ! wait_until "$timeout" "ResourceSlices of ${driver} listing ${expected_units} devices of ${worker}" \
    test "$(slice_devices "$ctx" "$worker")" = "$expected_units"; then
    say "FAIL: the ResourceSlices of driver ${driver} for ${worker} list" \
      "$(slice_devices "$ctx" "$worker") devices, expected ${expected_units}"
    diagnose "$ctx" dra
    return 1
  fi
  # Absent, or 0 for a while after a device plugin left: either way the scheduler takes
  # the DRA path on the node. Anything else means the name is served both ways.
  local advertised
  advertised=$(allocatable "$ctx" "$worker")
  if [[ -n $advertised && $advertised != 0 ]]; then
    say "FAIL: ${worker} still advertises ${advertised} ${resource} while serving through DRA"
    diagnose "$ctx" dra
    return 1
  fi
  local control_plane="${cluster}-control-plane" on_control_plane
  on_control_plane=$(slice_devices "$ctx" "$control_plane")
  if [[ $on_control_plane != 0 ]]; then
    say "FAIL: the unlabelled control plane has ${on_control_plane} devices in ResourceSlices of ${driver}"
    return 1
  fi
  on_control_plane=$(allocatable "$ctx" "$control_plane")
  if [[ -n $on_control_plane ]]; then
    say "FAIL: the unlabelled control plane advertises ${on_control_plane} ${resource}"
    return 1
  fi
}

check_dra_claim() { # context: the example pod got its accelerator through a DRA claim
  local ctx=$1 claim mappings
  claim=$(kubectl --context "$ctx" get pod accelerator-example \
    -o 'jsonpath={.status.extendedResourceClaimStatus.resourceClaimName}') || return 1
  mappings=$(kubectl --context "$ctx" get pod accelerator-example \
    -o 'jsonpath={range .status.extendedResourceClaimStatus.requestMappings[*]}{.containerName}/{.resourceName}{"\n"}{end}') ||
    return 1
  if [[ -z $claim || $'\n'$mappings$'\n' != *$'\n'"show-units/${resource}"$'\n'* ]]; then
    say "FAIL: the example pod has no status.extendedResourceClaimStatus for ${resource}" \
      "(claim '${claim}', mappings '${mappings//$'\n'/ }'): it was not served through DRA"
    diagnose "$ctx" dra
    return 1
  fi
  echo "$claim"
}

run_one() { # node-image overlay-dir api
  local node_image=$1 overlay=$2 api=$3
  local version=${node_image#*:}
  version=${version%%@*}
  local cluster="accel-${version//./-}"
  if [[ $api == dra ]]; then
    cluster+="-dra" # apart from a device-plugin entry of the same version
  fi
  local ctx="kind-${cluster}"
  local worker="${cluster}-worker"
  say "=== ${node_image} with ${overlay} (${api})"
  kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  current_cluster=$cluster
  # run_one is called as an `if` condition, where bash ignores set -e: every step checks.
  kind create cluster --name "$cluster" --image "$node_image" --config "$here/cluster.yaml" --wait "${timeout}s" || return 1
  kind load docker-image "$image" --name "$cluster" || return 1
  kubectl --context "$ctx" label node "$worker" "$label" --overwrite || return 1
  if [[ $api == dra ]]; then
    # DRA hands containers their devices only as CDI IDs: without CDI in the runtime the
    # example pod would start without ACCELERATOR_UNITS, for no visible reason.
    if ! cdi_enabled "$worker"; then
      say "FAIL: containerd on ${worker} does not have CDI enabled with /var/run/cdi" \
        "(containerd config dump)"
      return 1
    fi
    # As docs/deploying.md says: the policy and the DeviceClass before any plugin pod, which
    # chooses its API once per kubelet start and would find no class mapping ${resource}.
    kubectl --context "$ctx" apply -k "$repo/$dra_cluster_objects" || return 1
    local mapped
    mapped=$(kubectl --context "$ctx" get deviceclass "$driver" -o 'jsonpath={.spec.extendedResourceName}') ||
      return 1
    if [[ $mapped != "$resource" ]]; then
      say "FAIL: DeviceClass ${driver} maps '${mapped}', expected ${resource}: the API server" \
        "dropped extendedResourceName (DRAExtendedResource gate off?)"
      return 1
    fi
  fi
  kubectl --context "$ctx" apply -k "$repo/$overlay" || return 1
  if ! kubectl --context "$ctx" -n kube-system rollout status daemonset/accelerator-device-plugin --timeout="${timeout}s"; then
    diagnose "$ctx" "$api"
    return 1
  fi
  local scheduled
  scheduled=$(kubectl --context "$ctx" -n kube-system get daemonset accelerator-device-plugin -o 'jsonpath={.status.desiredNumberScheduled}')
  if [[ $scheduled != 1 ]]; then
    say "FAIL: the DaemonSet wants ${scheduled} pods; only the labelled worker should run one"
    diagnose "$ctx" "$api"
    return 1
  fi
  if [[ $api == dra ]]; then
    check_dra "$ctx" "$cluster" "$worker" || return 1
  else
    check_device_plugin "$ctx" "$cluster" "$worker" || return 1
  fi
  kubectl --context "$ctx" apply -f "$repo/deploy/pod-example.yml" || return 1
  if ! wait_until "$timeout" "the example pod to finish" pod_finished "$ctx"; then
    diagnose "$ctx" "$api"
    return 1
  fi
  local output
  output=$(kubectl --context "$ctx" logs accelerator-example) || return 1
  if [[ ! $output =~ ^ACCELERATOR_UNITS=([0-9]+)$ ]] || ((BASH_REMATCH[1] >= expected_units)); then
    say "FAIL: the example pod printed '${output}', expected ACCELERATOR_UNITS=<0..$((expected_units - 1))>"
    diagnose "$ctx" "$api"
    return 1
  fi
  if [[ $api == dra ]]; then
    local claim
    claim=$(check_dra_claim "$ctx") || return 1
    say "PASS ${version} (dra): ResourceSlices list ${expected_units} devices of ${worker}, which" \
      "advertises no ${resource}; example pod got ${output} through claim ${claim}"
  else
    say "PASS ${version}: ${worker} advertises ${expected_units} ${resource}; example pod got ${output}"
  fi
}

main() {
  local mode=matrix node_image="" overlay=compat_tests/kind api=device-plugin
  while (($#)); do
    case $1 in
      --all) mode=all ;;
      --check) mode=check ;;
      --node-image) node_image=${2:?--node-image needs a value}; mode=one; shift ;;
      --overlay) overlay=${2:?--overlay needs a value}; shift ;;
      --api) api=${2:?--api needs a value}; shift ;;
      -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; return 0 ;;
      *) say "unknown argument $1"; return 2 ;;
    esac
    shift
  done
  if [[ $api != device-plugin && $api != dra ]]; then
    say "--api must be device-plugin or dra, not ${api}"
    return 2
  fi
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
  local entries=() k8s kind_release img dir entry_api
  if [[ $mode == one ]]; then
    entries=("- - ${node_image} ${overlay} ${api}")
  else
    local installed
    installed=$(kind version | awk '{print $2}')
    while read -r k8s kind_release img dir entry_api; do
      [[ -z $k8s || $k8s == \#* ]] && continue
      if [[ $entry_api != device-plugin && $entry_api != dra ]]; then
        say "matrix.txt: ${k8s}: the API column must be device-plugin or dra, not '${entry_api}'"
        return 2
      fi
      if [[ $mode == matrix && $kind_release != "$installed" ]]; then
        say "skip ${k8s}: its node image is built for kind ${kind_release}, this is kind ${installed}"
        continue
      fi
      entries+=("${k8s} ${kind_release} ${img} ${dir} ${entry_api}")
    done <"$here/matrix.txt"
  fi
  if ((${#entries[@]} == 0)); then
    say "no matrix entry for this kind release; use --all or --node-image"
    return 1
  fi
  trap cleanup EXIT
  if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    docker build -f "$repo/Dockerfile.multistage" -t "$image" "$repo"
  fi
  local failed=0 passed=0 entry
  for entry in "${entries[@]}"; do
    read -r _ _ img dir entry_api <<<"$entry"
    if run_one "$img" "$dir" "$entry_api"; then
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
