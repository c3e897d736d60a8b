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
{{- $sec := .values.security | default dict -}}
{{- $tls := $sec.tls | default dict -}}
{{- if $tls.secretName -}}
{{- range $l := $tls.listeners -}}
{{- $c := ternary $s.http (get $s.receivers $l) (eq $l "http") -}}
{{- $t := $c.tls | default dict -}}
{{- if not $t.cert_file }}{{ $_ := set $t "cert_file" (printf "%s/tls.crt" $tls.mountPath) }}{{ end -}}
{{- if not $t.key_file }}{{ $_ := set $t "key_file" (printf "%s/tls.key" $tls.mountPath) }}{{ end -}}
{{- if and $tls.clientCA (not $t.client_ca_file) }}{{ $_ := set $t "client_ca_file" (printf "%s/ca.crt" $tls.mountPath) }}{{ end -}}
{{- $_ := set $c "tls" $t -}}
{{- end -}}
{{- end -}}
{{- $tok := $sec.token | default dict -}}
{{- if $tok.secretName -}}
{{- range $l := $tok.listeners -}}
{{- $c := ternary $s.http (get $s.receivers $l) (eq $l "http") -}}
{{- $a := $c.auth | default dict -}}
{{- if not $a.bearer_token_file }}{{ $_ := set $a "bearer_token_file" (printf "%s/%s" $tok.mountPath $tok.key) }}{{ end -}}
{{- $_ := set $c "auth" $a -}}
{{- end -}}
{{- end -}}
{{- toYaml $s -}}
{{- end -}}

{{/* "HTTPS" when the http listener (probes, /metrics, API) speaks TLS, else "HTTP". */}}
{{- define "coeffd.httpScheme" -}}
{{- $s := include "coeffd.effectiveSettings" . | fromYaml -}}
{{- ternary "HTTPS" "HTTP" (not (empty (($s.http.tls | default dict).cert_file))) -}}
{{- end -}}

{{/*
A scrape endpoint's scheme, tlsConfig and bearer (ServiceMonitor / PodMonitor): https
with the given tlsConfig when the http listener serves TLS; the token Secret when
/metrics is not public. Call with (dict "root" $ "values" .Values "tlsConfig" ...).
*/}}
{{- define "coeffd.scrapeSecurity" -}}
{{- if eq (include "coeffd.httpScheme" .) "HTTPS" }}
scheme: https
{{- with .tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- $s := include "coeffd.effectiveSettings" . | fromYaml }}
{{- $tok := (.values.security | default dict).token | default dict }}
{{- if and (not $s.http.metrics_public) $tok.secretName (has "http" $tok.listeners) }}
authorization:
  type: Bearer
  credentials:
    name: {{ $tok.secretName }}
    key: {{ $tok.key }}
{{- end }}
{{- end -}}
