{{/*
Ports and paths come out of .values.settings, so config.toml and the pod spec can
never disagree. These are the only places that know where in the settings tree
they live.
*/}}
{{- define "coeffd.endpointPort" -}}{{ regexReplaceAll "^.*:" . "" }}{{- end -}}
{{- define "coeffd.port.otlpGrpc" -}}{{ include "coeffd.endpointPort" .values.settings.receivers.otlp_grpc.endpoint }}{{- end -}}
{{- define "coeffd.port.otlpHttp" -}}{{ include "coeffd.endpointPort" .values.settings.receivers.otlp_http.endpoint }}{{- end -}}
{{- define "coeffd.port.http" -}}{{ include "coeffd.endpointPort" .values.settings.http.endpoint }}{{- end -}}
{{- define "coeffd.dataDir" -}}/var/lib/coeffd{{- end -}}

{{/* settings as the daemon must see them in this mode (YAML; read back with fromYaml). */}}
{{- define "coeffd.effectiveSettings" -}}
{{- $s := deepCopy .values.settings -}}
{{- $_ := set $s "mode" (ternary "sidecar" "standalone" (eq .values.mode "sidecar")) -}}
{{- if and (eq .values.mode "sidecar") .values.sidecar.vllm.kvEvents (not ($s.kv | default dict).endpoints) -}}
{{- $kvPort := int64 (regexReplaceAll "^.*:" .values.sidecar.vllm.kvEventsEndpoint "") -}}
{{- $endpoints := list -}}
{{- range $rank := until (int (.values.settings.configuration.dp | default 1)) -}}
{{- $endpoints = append $endpoints (printf "tcp://127.0.0.1:%d" (add $kvPort $rank)) -}}
{{- end -}}
{{- $_ := set $s "kv" (merge (dict "endpoints" $endpoints) ($s.kv | default dict)) -}}
{{- end -}}
{{- if and (eq .values.mode "sidecar") .values.sidecar.localhostOnly -}}
{{- $_ := set $s.receivers.otlp_grpc "endpoint" (printf "127.0.0.1:%s" (include "coeffd.port.otlpGrpc" .)) -}}
{{- $_ := set $s.receivers.otlp_http "endpoint" (printf "127.0.0.1:%s" (include "coeffd.port.otlpHttp" .)) -}}
{{- end -}}
{{- toYaml $s -}}
{{- end -}}
