{{- /*
adp.stopping: how long one pool's pods may take to stop, as JSON {"stop": seconds or null,
"grace": seconds or null}. "stop" is the stop-timeout the chart writes into config.yaml
(null: the pool's config already says, or serve's default applies); "grace" is the pod's
terminationGracePeriodSeconds (null: Kubernetes' default, 30 s).

On SIGTERM the DRA driver takes no new claim, waits up to --stop-timeout for the loads and
clears under way, cuts off what is left (a load's card quarantined) and only then gives up
its socket. The loader, a native sidecar, is sent SIGTERM only once the driver has exited,
and finishes a load under way (bounded by --program-timeout) before it stops. The kubelet
kills whatever still runs at the end of the grace period: the same quarantine, with nothing
in the log. So, with programming on:
  - stop-timeout: programming.timeoutSeconds + 10 (capped at serve's 3600): a load the driver
    waits for lasts at most --program-timeout, plus 5 s for the loader's answer and 2 s to
    connect (plugin/programming/remote/client.py);
  - grace: the longer of stop-timeout and --program-timeout, rounded up, + 15 s: the driver's
    own stop after the wait, then the loader's.
Without programming nothing is waited for: the pod's default stays, unless config sets a
stop-timeout (then its grace follows the same rule). terminationGracePeriodSeconds given by
the user wins, and must be above the pool's stop-timeout, or the chart fails.

Arguments: root, cfg (the pool's merged config), own (the pool's own config), index (the
pool's), programming (bool), timeout (programming.timeoutSeconds).
*/ -}}
{{- define "adp.stopping" -}}
{{- $ := .root -}}
{{- $margin := 10 -}}
{{- $graceMargin := 15 -}}
{{- $serveDefault := 25 -}}
{{- $serveMax := 3600 -}}
{{- $given := hasKey .cfg "stop-timeout" -}}
{{- $stop := get .cfg "stop-timeout" -}}
{{- $written := dict -}}
{{- $source := printf "%sconfig.stop-timeout" (ternary (printf "nodePools[%d]." (int .index)) "" (hasKey .own "stop-timeout")) -}}
{{- if not $given -}}
  {{- if .programming -}}
    {{- $stop = minf (addf .timeout $margin) $serveMax -}}
    {{- $_ := set $written "stop" $stop -}}
    {{- $source = printf "programming.timeoutSeconds %v + %d, set by the chart" .timeout $margin -}}
  {{- else -}}
    {{- $stop = $serveDefault -}}
    {{- $source = "serve's default" -}}
  {{- end -}}
{{- end -}}
{{- $longest := ternary (maxf $stop .timeout) $stop (.programming | default false) -}}
{{- $automatic := add (ceil $longest) $graceMargin -}}
{{- $nullPicks := ternary (printf "%d" (int $automatic)) "Kubernetes' default, 30" (or .programming $given) -}}
{{- $grace := $.Values.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $grace -}}
  {{- if or .programming $given -}}
    {{- $_ := set $written "grace" $automatic -}}
  {{- end -}}
{{- else if le (float64 $grace) (float64 $stop) -}}
  {{- fail (printf "terminationGracePeriodSeconds: %v is not above the stop-timeout, %v s (%s): the kubelet would kill the pod while the driver still waits for its loads and clears, which leaves their cards quarantined with nothing in the log. Raise terminationGracePeriodSeconds above %v (null picks %s), or set %s below %v" $grace $stop $source $stop $nullPicks (ternary $source "config.stop-timeout" $given) $grace) -}}
{{- else -}}
  {{- $_ := set $written "grace" $grace -}}
{{- end -}}
{{- $written | toJson -}}
{{- end -}}
