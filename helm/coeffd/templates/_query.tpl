{{/*
=== The query tier (query.enabled): `coeffd serve` with mode = "query" ===

It runs no receivers and no learners: every query.settings.refresh_interval_seconds it
asks each peer's GET /v1/statistics on the HTTP API port, merges members of the same
configuration and serves the same /v1 API, so `coeffd pull` and BLIS have one place to ask.

Peers: fleet mode, dns+ the fleet's headless Service (one address per replica); sidecar
mode, dns+ the "<fullname>-peers" headless Service over the vLLM pods' coeffd API port.
The client side reuses the API's own security: the CA of security.tls verifies the
peers (https when the http listener serves TLS), its certificate is the client
certificate when security.tls.clientCA asks peers for one, and the token of
security.token is sent as the bearer. Anything set in query.settings wins.
*/}}

{{/* The query tier's settings (YAML; read back with fromYaml). */}}
{{- define "coeffd.querySettings" -}}
{{- $v := .values -}}
{{- $s := include "coeffd.effectiveSettings" . | fromYaml -}}
{{- $q := deepCopy ($v.query.settings | default dict) -}}
{{- $client := $q.client | default dict -}}
{{- $port := include "coeffd.port.http" . -}}
{{- $svc := ternary (include "coeffd.peersName" .) (include "coeffd.headlessName" .) (eq $v.mode "sidecar") -}}
{{- $host := printf "%s.%s.svc" $svc .root.Release.Namespace -}}
{{- if not $q.peers -}}
{{- if and (eq $v.mode "fleet") (not $v.fleet.headlessService.enabled) -}}
{{- fail "coeffd: query.enabled resolves the fleet through its headless Service: set fleet.headlessService.enabled=true, or query.settings.peers, or query.enabled=false" -}}
{{- end -}}
{{- $_ := set $q "peers" (printf "dns+%s:%s" $host $port) -}}
{{- end -}}
{{- $https := not (empty (($s.http.tls | default dict).cert_file)) -}}
{{- if not $q.dns_scheme }}{{ $_ := set $q "dns_scheme" (ternary "https" "http" $https) }}{{ end -}}
{{- $sec := $v.security | default dict -}}
{{- $tls := $sec.tls | default dict -}}
{{- if and $tls.secretName (has "http" $tls.listeners) -}}
{{- if not $client.ca_file }}{{ $_ := set $client "ca_file" (printf "%s/ca.crt" $tls.mountPath) }}{{ end -}}
{{- if not $client.server_name }}{{ $_ := set $client "server_name" $host }}{{ end -}}
{{- if $tls.clientCA -}}
{{- if not $client.cert_file }}{{ $_ := set $client "cert_file" (printf "%s/tls.crt" $tls.mountPath) }}{{ end -}}
{{- if not $client.key_file }}{{ $_ := set $client "key_file" (printf "%s/tls.key" $tls.mountPath) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $tok := $sec.token | default dict -}}
{{- if and $tok.secretName (has "http" $tok.listeners) (not $client.bearer_token_file) -}}
{{- $_ := set $client "bearer_token_file" (printf "%s/%s" $tok.mountPath $tok.key) -}}
{{- end -}}
{{- $_ := set $q "client" $client -}}
{{- $out := dict "mode" "query" "query" $q "log" $s.log "http" $s.http "publish" $s.publish "state" $s.state -}}
{{- $_ := set $out "receivers" (dict "otlp_grpc" (dict "enabled" false) "otlp_http" (dict "enabled" false)) -}}
{{- with $s.catalog }}{{ $_ := set $out "catalog" . }}{{ end -}}
{{- with $s.learners }}{{ $_ := set $out "learners" . }}{{ end -}}
{{- if hasKey ($s.pipeline | default dict) "blas_threads" -}}
{{- $_ := set $out "pipeline" (dict "blas_threads" $s.pipeline.blas_threads) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{- define "coeffd.queryContainer" -}}
{{- $v := .values -}}
{{- $scheme := include "coeffd.httpScheme" . -}}
- name: coeffd-query
  image: {{ include "coeffd.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    - serve
    - --config
    - /etc/coeffd/config.toml
    {{- with $v.query.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $v.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: coeffd-http
      containerPort: {{ include "coeffd.port.http" . }}
      protocol: TCP
  startupProbe:
    httpGet:
      path: /healthz
      port: coeffd-http
      scheme: {{ $scheme }}
    {{- toYaml $v.probes.startup | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: coeffd-http
      scheme: {{ $scheme }}
    {{- toYaml $v.probes.liveness | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: coeffd-http
      scheme: {{ $scheme }}
    {{- toYaml $v.probes.readiness | nindent 4 }}
  {{- with $v.query.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    {{- include "coeffd.volumeMounts" . | nindent 4 }}
{{- end -}}
