{{/*
Ports and paths come out of .values.settings, so config.toml and the pod spec can
never disagree. These are the only places that know where in the settings tree
they live.
*/}}
{{- define "coeffd.port.otlpGrpc" -}}{{ int64 .values.settings.receivers.grpc.port }}{{- end -}}
{{- define "coeffd.port.otlpHttp" -}}{{ int64 .values.settings.receivers.http.port }}{{- end -}}
{{- define "coeffd.port.http" -}}{{ int64 .values.settings.http.port }}{{- end -}}
{{- define "coeffd.dataDir" -}}/var/lib/coeffd{{- end -}}

{{/* settings as the daemon must see them in this mode (YAML; read back with fromYaml). */}}
{{- define "coeffd.effectiveSettings" -}}
{{- $s := deepCopy .values.settings -}}
{{- if and (eq .values.mode "sidecar") .values.sidecar.localhostOnly -}}
{{- $_ := set $s.receivers.grpc "host" "127.0.0.1" -}}
{{- $_ := set $s.receivers.http "host" "127.0.0.1" -}}
{{- end -}}
{{- toYaml $s -}}
{{- end -}}
