{{/* Names, labels, and the node pools each template renders from. */}}

{{- define "adp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "adp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "adp.namespace" -}}
{{- default .Release.Namespace .Values.namespace -}}
{{- end -}}

{{- define "adp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "adp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "adp.labels" -}}
{{ include "adp.selectorLabels" . }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "adp.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "adp.serviceAccountName" -}}
{{- default (include "adp.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "adp.driverName" -}}
{{- index .Values.config "dra-driver-name" | default "accelerator.b-com.com" -}}
{{- end -}}

{{/*
adp.pools: every DaemonSet to render, as JSON {"pools": [...], "anyDra", "anyApi",
"anyEvents"}. Each pool carries its name, its DaemonSet and ConfigMap names, its effective
nodeSelector (global, then its own on top), its own labels (where it differs from the global
selector), the affinity that keeps it off every other pool's nodes, its tolerations and
resources, its config (global, then its own on top) as the plugin will read it, and its
pods' grace period (adp.stopping, which also fills in the stop-timeout with programming).

Pools never share a node. A pool's identity is its nodeSelector (affinity can only narrow
it), and:
  - two pools with selectors of their own must differ in the value of a label both select
    on, so no node can match both; the chart refuses them otherwise;
  - at most one pool has no selector of its own: it takes every node of the global selector
    that no other pool selects;
  - every pool's DaemonSet also excludes every other pool's nodes through required node
    affinity: "label NotIn [value]" (which a node without the label also satisfies) on the
    differing label, or for the pool without a selector on each label of the other pool, one
    node selector term per combination.
*/}}
{{- define "adp.pools" -}}
{{- $fullname := include "adp.fullname" . -}}
{{- $global := .Values.config | default dict -}}
{{- $globalSel := .Values.nodeSelector | default dict -}}
{{- $input := .Values.nodePools | default list -}}
{{- $named := true -}}
{{- if not $input -}}
{{- $named = false -}}
{{- $input = list (dict "name" "default") -}}
{{- end -}}
{{- $drivers := list -}}
{{- $pools := list -}}
{{- $seen := dict -}}
{{- $anyDra := false -}}
{{- $anyApi := false -}}
{{- $anyEvents := false -}}
{{- $programming := .Values.programming | default dict -}}
{{- range $index, $p := $input -}}
  {{- if hasKey $seen $p.name -}}
    {{- fail (printf "nodePools[%d].name: %q is used by an earlier pool; each pool names its own DaemonSet and ConfigMap" $index $p.name) -}}
  {{- end -}}
  {{- $_ := set $seen $p.name true -}}
  {{- $own := deepCopy ($p.config | default dict) -}}
  {{- if hasKey $own "dra-driver-name" -}}
    {{- fail (printf "nodePools[%d].config.dra-driver-name: the driver name is cluster-wide (DeviceClass, ResourceSlice policy); set config.dra-driver-name instead" $index) -}}
  {{- end -}}
  {{- $merged := mergeOverwrite (deepCopy $global) $own -}}
  {{- $cfg := dict -}}
  {{- range $k, $v := $merged -}}
    {{- if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v ""))) -}}
      {{- $_ := set $cfg $k $v -}}
    {{- end -}}
  {{- end -}}
  {{- $api := get $cfg "api" | default "device-plugin" -}}
  {{- $dra := has $api (list "dra" "auto") -}}
  {{- if hasKey $cfg "cdi" -}}
    {{- if and $dra (not (get $cfg "cdi")) -}}
      {{- fail (printf "%sconfig.cdi: false with api %q, but DRA hands containers their devices only as CDI devices; leave cdi unset or true" (ternary (printf "nodePools[%d]." $index) "" (hasKey $own "cdi")) $api) -}}
    {{- end -}}
  {{- else -}}
    {{- $_ := set $cfg "cdi" $dra -}}
  {{- end -}}
  {{- if and $dra (ne (get $cfg "resource-name" | default "") (get $global "resource-name" | default "")) -}}
    {{- fail (printf "nodePools[%d].config.resource-name: a pool with api %q serves the resource the DeviceClass maps, config.resource-name (%v)" $index $api (get $global "resource-name")) -}}
  {{- end -}}
  {{- if $programming.enabled -}}
    {{- if not $dra -}}
      {{- fail (printf "programming.enabled: FPGA programming is asked for through DRA claims and DeviceClasses, but %s has api %q; set %sconfig.api to dra or auto, or programming.enabled to false" (ternary (printf "node pool %q" $p.name) "the DaemonSet" $named) $api (ternary (printf "nodePools[%d]." $index) "" (hasKey $own "api"))) -}}
    {{- end -}}
    {{- $_ := set $cfg "programming" "on" -}}
    {{- $_ := set $cfg "image-library" $programming.imageLibrary.hostPath -}}
    {{- $_ := set $cfg "image-max-bytes" (int64 $programming.maxImageBytes) -}}
    {{- $_ := set $cfg "require-image-digest" ($programming.requireImageDigest | default false) -}}
    {{- $_ := set $cfg "intel-loader" $programming.intelLoader -}}
    {{- $_ := set $cfg "fpgaconf" $programming.fpgaconf -}}
    {{- $_ := set $cfg "xbutil" $programming.xbutil -}}
    {{- $_ := set $cfg "fpga-load-local-image" $programming.fpgaLoadLocalImage -}}
    {{- $_ := set $cfg "fpga-describe-local-image" $programming.fpgaDescribeLocalImage -}}
    {{- $_ := set $cfg "program-timeout" $programming.timeoutSeconds -}}
  {{- end -}}
  {{- $stopping := include "adp.stopping" (dict "root" $ "cfg" $cfg "own" $own "index" $index "programming" ($programming.enabled | default false) "timeout" $programming.timeoutSeconds) | fromJson -}}
  {{- if hasKey $stopping "stop" -}}
    {{- $_ := set $cfg "stop-timeout" $stopping.stop -}}
  {{- end -}}
  {{- if and $dra $.Values.functionAdmission.enabled -}}
    {{- /* The driver guards the catalogue at prepare too (function-admission.yaml): it
    finds the catalogue ConfigMap by label in the release namespace, and keeps the classes
    rendered here guarded while that ConfigMap is missing. */ -}}
    {{- $guarded := list -}}
    {{- if $programming.enabled -}}
      {{- range $programming.deviceClasses -}}{{- $guarded = append $guarded .name -}}{{- end -}}
    {{- end -}}
    {{- range $.Values.functionAdmission.deviceClasses -}}{{- $guarded = append $guarded .name -}}{{- end -}}
    {{- $_ := set $cfg "function-grants" (include "adp.namespace" $) -}}
    {{- $_ := set $cfg "guarded-classes" ($guarded | uniq | sortAlpha | join ",") -}}
  {{- end -}}
  {{- $eventsMode := get $cfg "events" | default "auto" -}}
  {{- $events := or (eq $eventsMode "on") (and (eq $eventsMode "auto") $dra) -}}
  {{- $needsApi := or $dra $events -}}
  {{- $anyDra = or $anyDra $dra -}}
  {{- $anyApi = or $anyApi $needsApi -}}
  {{- $anyEvents = or $anyEvents $events -}}
  {{- $sel := merge (deepCopy ($p.nodeSelector | default dict)) $globalSel -}}
  {{- $ownLabels := dict -}}
  {{- range $k, $v := $sel -}}
    {{- if not (and (hasKey $globalSel $k) (eq (toString (get $globalSel $k)) (toString $v))) -}}
      {{- $_ := set $ownLabels $k $v -}}
    {{- end -}}
  {{- end -}}
  {{- $dsName := $fullname -}}
  {{- if $named -}}
    {{- $dsName = printf "%s-%s" ($fullname | trunc (int (sub 62 (len $p.name))) | trimSuffix "-") $p.name -}}
  {{- end -}}
  {{- $affinity := deepCopy (ternary $p.affinity $.Values.affinity (hasKey $p "affinity")) | default dict -}}
  {{- $tolerations := ternary $p.tolerations $.Values.tolerations (hasKey $p "tolerations") -}}
  {{- $resources := ternary $p.resources $.Values.resources (hasKey $p "resources") -}}
  {{- $pools = append $pools (dict "index" $index "name" $p.name "dsName" $dsName "configName" (printf "%s-config" $dsName) "selector" $sel "own" $ownLabels "isDefault" (empty $ownLabels) "affinity" $affinity "tolerations" $tolerations "resources" $resources "config" $cfg "api" $api "dra" $dra "events" $events "needsApi" $needsApi "grace" (get $stopping "grace")) -}}
{{- end -}}
{{- /* At most one pool without a selector of its own. */ -}}
{{- $defaults := list -}}
{{- range $pools -}}{{- if .isDefault -}}{{- $defaults = append $defaults .name -}}{{- end -}}{{- end -}}
{{- if gt (len $defaults) 1 -}}
  {{- fail (printf "nodePools: %s have no nodeSelector of their own (beyond the global nodeSelector); at most one pool may, and it takes every node no other pool selects" (join ", " $defaults)) -}}
{{- end -}}
{{- /* Each pool's exclusions of every other pool, as node affinity. */ -}}
{{- $result := list -}}
{{- range $i, $p := $pools -}}
  {{- $groups := list -}}
  {{- range $j, $q := $pools -}}
    {{- if and (ne $i $j) (not $q.isDefault) -}}
      {{- $conflict := "" -}}
      {{- range $k, $v := $q.selector -}}
        {{- if and (eq $conflict "") (hasKey $p.selector $k) (ne (toString (get $p.selector $k)) (toString $v)) -}}
          {{- $conflict = $k -}}
        {{- end -}}
      {{- end -}}
      {{- if ne $conflict "" -}}
        {{- $groups = append $groups (list (dict "key" $conflict "operator" "NotIn" "values" (list (toString (get $q.selector $conflict))))) -}}
      {{- else if $p.isDefault -}}
        {{- $group := list -}}
        {{- range $k, $v := $q.own -}}
          {{- $group = append $group (dict "key" $k "operator" "NotIn" "values" (list (toString $v))) -}}
        {{- end -}}
        {{- $groups = append $groups $group -}}
      {{- else -}}
        {{- fail (printf "nodePools: %q (own nodeSelector %s) and %q (own nodeSelector %s) may select the same node; give them different values of one label both select on, or leave one without a nodeSelector of its own so that it takes the nodes the others do not" $p.name (toJson $p.own) $q.name (toJson $q.own)) -}}
      {{- end -}}
    {{- end -}}
  {{- end -}}
  {{- $terms := list (list) -}}
  {{- range $group := $groups -}}
    {{- $next := list -}}
    {{- range $t := $terms -}}
      {{- range $e := $group -}}
        {{- $next = append $next (append $t $e) -}}
      {{- end -}}
    {{- end -}}
    {{- $terms = $next -}}
  {{- end -}}
  {{- $affinity := $p.affinity -}}
  {{- if $groups -}}
    {{- $nodeAffinity := $affinity.nodeAffinity | default dict -}}
    {{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
    {{- $userTerms := get $required "nodeSelectorTerms" | default (list dict) -}}
    {{- $final := list -}}
    {{- range $u := $userTerms -}}
      {{- range $t := $terms -}}
        {{- $term := deepCopy $u -}}
        {{- $_ := set $term "matchExpressions" (concat (get $term "matchExpressions" | default list) $t) -}}
        {{- $final = append $final $term -}}
      {{- end -}}
    {{- end -}}
    {{- if gt (len $final) 32 -}}
      {{- fail (printf "nodePools[%d] (%s): excluding the other pools takes %d node selector terms (at most 32); select pools on fewer labels" $p.index $p.name (len $final)) -}}
    {{- end -}}
    {{- $_ := set $required "nodeSelectorTerms" $final -}}
    {{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
    {{- $_ := set $affinity "nodeAffinity" $nodeAffinity -}}
  {{- end -}}
  {{- $_ := set $p "affinity" $affinity -}}
  {{- $result = append $result $p -}}
{{- end -}}
{{- if and $anyDra (not (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version)) -}}
  {{- fail (printf "config.api: dra and auto need Kubernetes 1.34 or later (resource.k8s.io/v1); this cluster is %s. Use api device-plugin" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- dict "pools" $result "anyDra" $anyDra "anyApi" $anyApi "anyEvents" $anyEvents "programming" (and $anyDra $programming.enabled) | toJson -}}
{{- end -}}
