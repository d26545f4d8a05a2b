{{- /*
The loader container (programming.enabled): a native sidecar (an init container with
restartPolicy Always) that starts, and whose socket exists, before the driver starts. The
only privileged container of the pod: no token (the pod's automount is off; the driver's
token is a volume mounted into the driver only) and no network (it leaves the pod's network
namespace at start). It reads the same config.yaml as the driver, so it discovers with the
same backend and loads with the same loader settings, require-image-digest included
(programming.requireImageDigest: the loader then refuses an unpinned image itself). docs/deploying.md has the table of
what each container can do.
*/ -}}
{{- define "adp.loaderContainer" -}}
{{- $ := .root -}}
- name: loader
  image: {{ include "adp.image" $ }}
  imagePullPolicy: {{ $.Values.image.pullPolicy }}
  restartPolicy: Always
  command: ["accelerator-device-plugin"]
  args: ["loader"]
  env:
    - name: ACCELERATOR_DP_CONFIG
      value: /etc/accelerator-device-plugin/config.yaml
    {{- if .hardware }}
    - name: ACCELERATOR_DP_SYSFS_ROOT
      value: /host/sys
    - name: ACCELERATOR_DP_DEV_ROOT
      value: /host/dev
    {{- end }}
    - name: ACCELERATOR_DP_LOADER_SOCKET
      value: /run/accelerator-loader/loader.sock
    # The driver runs as root (UID 0): only its connections are served.
    - name: ACCELERATOR_DP_LOADER_ALLOWED_UIDS
      value: "0"
    # The driver's state directory, where each card's lock and load record are kept: every
    # process that may program a card (this loader, the next pod's in a rolling update)
    # must share it, at the driver's path.
    - name: ACCELERATOR_DP_DRA_STATE_DIR
      value: {{ .stateDir }}
  {{- with $.Values.programming.loader.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  # Started once its socket exists: the driver finds it at once.
  startupProbe:
    exec:
      command: ["accelerator-device-plugin", "healthcheck", "--heartbeat-file",
                "/run/accelerator-loader/loader.sock", "--heartbeat-max-age", "86400"]
    periodSeconds: 1
    failureThreshold: 60
  # Loading writes to device nodes the kubelet never hands to a container, and no pod
  # field admits one device to a container's device cgroup but privileged. The API server
  # refuses allowPrivilegeEscalation false beside privileged.
  securityContext:
    runAsUser: 0
    runAsGroup: 0
    runAsNonRoot: false
    privileged: true
    allowPrivilegeEscalation: true
    readOnlyRootFilesystem: true
  volumeMounts:
    - name: config
      mountPath: /etc/accelerator-device-plugin
      readOnly: true
    {{- if .hardware }}
    - name: sys-class
      mountPath: /host/sys/class
      readOnly: true
    - name: sys-bus
      mountPath: /host/sys/bus
      readOnly: true
    - name: sys-devices
      mountPath: /host/sys/devices
      readOnly: true
    # Read-only: that does not stop a write to a device node, only to files.
    - name: dev
      mountPath: /host/dev
      readOnly: true
    {{- end }}
    - name: image-library
      mountPath: {{ $.Values.programming.imageLibrary.hostPath }}
      readOnly: true
    {{- range $i, $path := $.Values.programming.toolsHostPaths }}
    - name: tools-{{ $i }}
      mountPath: {{ $path }}
      readOnly: true
    {{- end }}
    - name: loader-socket
      mountPath: /run/accelerator-loader
    # Read-write: the card locks and the records of loads (cards/ in it).
    - name: dra-state
      mountPath: {{ .stateDir }}
{{- end -}}
