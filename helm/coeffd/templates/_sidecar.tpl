{{/*
=== Sidecar mode: named templates for a vLLM chart or manifest ===

In the vLLM chart (coeffd as a dependency with `coeffd.mode: sidecar`):

    spec:
      containers:
        - name: vllm
          args:
            {{- include "coeffd.vllmArgs" (dict "root" $ "values" .Values.coeffd) | nindent 12 }}
          env:
            {{- include "coeffd.vllmEnv" (dict "root" $ "values" .Values.coeffd) | nindent 12 }}
        {{- include "coeffd.sidecarContainer" (dict "root" $ "values" .Values.coeffd) | nindent 8 }}
      volumes:
        {{- include "coeffd.sidecarVolumes" (dict "root" $ "values" .Values.coeffd) | nindent 8 }}

"coeffd.vllmArgs" renders vLLM's model/serving flags from settings.configuration — the
same values coeffd's identity is rendered from, so the two cannot drift apart — plus
the tracing and KV-event flags pointed at the sidecar on localhost.
*/}}

{{- define "coeffd.container" -}}
{{- $v := .values -}}
{{- $scheme := include "coeffd.httpScheme" . -}}
- name: coeffd
  image: {{ include "coeffd.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if and (eq $v.mode "sidecar") $v.sidecar.native }}
  restartPolicy: Always
  {{- end }}
  args: {{ concat (list "serve" "--config" "/etc/coeffd/config.toml") ($v.extraArgs | default list) | toJson }}
  {{- with $v.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: otlp-grpc
      containerPort: {{ include "coeffd.port.otlpGrpc" . }}
      protocol: TCP
    - name: otlp-http
      containerPort: {{ include "coeffd.port.otlpHttp" . }}
      protocol: TCP
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
  {{- /* A sidecar's readiness is its pod's: failed state writes or an unreachable KV
  publisher must not take vLLM out of its Service (alerts cover them); dead threads do. */}}
  readinessProbe:
    httpGet:
      path: {{ if eq $v.mode "sidecar" }}/readyz?exclude=kv,checkpoints,snapshots{{ else }}/readyz{{ end }}
      port: coeffd-http
      scheme: {{ $scheme }}
    {{- toYaml $v.probes.readiness | nindent 4 }}
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    {{- include "coeffd.volumeMounts" . | nindent 4 }}
{{- end -}}

{{/* Every coeffd container's mounts: config, data, /tmp, the security Secrets, extraVolumeMounts. */}}
{{- define "coeffd.volumeMounts" -}}
{{- $sec := .values.security | default dict -}}
- name: coeffd-config
  mountPath: /etc/coeffd
  readOnly: true
- name: coeffd-data
  mountPath: {{ include "coeffd.dataDir" . }}
- name: coeffd-tmp
  mountPath: /tmp
{{- with ($sec.tls | default dict) }}{{ if .secretName }}
- name: coeffd-tls
  mountPath: {{ .mountPath }}
  readOnly: true
{{- end }}{{ end }}
{{- with ($sec.token | default dict) }}{{ if .secretName }}
- name: coeffd-token
  mountPath: {{ .mountPath }}
  readOnly: true
{{- end }}{{ end }}
{{- with .values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "coeffd.sidecarContainer" -}}
{{- if ne .values.mode "sidecar" -}}
{{- fail "coeffd.sidecarContainer: set coeffd.mode=sidecar (it makes settings.configuration required and binds the receivers to localhost)" -}}
{{- end -}}
{{ include "coeffd.container" . }}
{{- end -}}

{{- define "coeffd.configVolume" -}}
- name: coeffd-config
  configMap:
    name: {{ include "coeffd.fullname" . }}
{{ include "coeffd.runtimeVolumes" . }}
{{- end -}}

{{/* /tmp, the Secrets of security.tls / security.token and extraVolumes (every coeffd pod). */}}
{{- define "coeffd.runtimeVolumes" -}}
- name: coeffd-tmp
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- $sec := .values.security | default dict -}}
{{- with ($sec.tls | default dict) }}{{ if .secretName }}
- name: coeffd-tls
  secret:
    secretName: {{ .secretName }}
    # world-readable inside the container only: a vLLM pod may not set fsGroup
    defaultMode: 0444
{{- end }}{{ end }}
{{- with ($sec.token | default dict) }}{{ if .secretName }}
- name: coeffd-token
  secret:
    secretName: {{ .secretName }}
    items:
      - key: {{ .key }}
        path: {{ .key }}
    defaultMode: 0444
{{- end }}{{ end }}
{{- with .values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "coeffd.sidecarVolumes" -}}
{{ include "coeffd.configVolume" . }}
- name: coeffd-data
{{- if .values.sidecar.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .values.sidecar.existingClaim }}
{{- else }}
  emptyDir:
    sizeLimit: 1Gi
{{- end }}
{{- end -}}

{{- define "coeffd.vllmServiceName" -}}
{{- default (printf "vllm-%s" .root.Release.Name) .values.sidecar.vllm.serviceName -}}
{{- end -}}

{{/* vLLM flags: serving identity from settings.configuration, then telemetry. */}}
{{- define "coeffd.vllmArgs" -}}
{{- $c := .values.settings.configuration | default dict -}}
{{- $t := .values.sidecar.vllm -}}
- --model
- {{ $t.model | default $c.model | quote }}
{{- range $key, $flag := dict "tp" "--tensor-parallel-size" "dp" "--data-parallel-size" "max_num_batched_tokens" "--max-num-batched-tokens" "max_num_seqs" "--max-num-seqs" "max_model_len" "--max-model-len" "block_size" "--block-size" }}
{{- if hasKey $c $key }}
- {{ $flag }}
- {{ int64 (get $c $key) | quote }}
{{- end }}
{{- end }}
{{- range $key, $flag := dict "chunked_prefill" "enable-chunked-prefill" "prefix_caching" "enable-prefix-caching" "async_scheduling" "async-scheduling" }}
{{- if and (hasKey $c $key) (not (kindIs "invalid" (get $c $key))) }}
- --{{ ternary "" "no-" (get $c $key) }}{{ $flag }}
{{- end }}
{{- end }}
{{- if $c.ep }}
- --enable-expert-parallel
{{- end }}
{{- if $c.moe_comm_backend }}
- --all2all-backend
- {{ $c.moe_comm_backend | quote }}
{{- end }}
{{- if and $c.kv_cache_dtype (ne $c.kv_cache_dtype "auto") }}
- --kv-cache-dtype
- {{ $c.kv_cache_dtype | quote }}
{{- end }}
- --otlp-traces-endpoint
{{- if eq $t.otlpProtocol "http/protobuf" }}
- {{ printf "http://localhost:%s/v1/traces" (include "coeffd.port.otlpHttp" .) | quote }}
{{- else }}
- {{ printf "http://localhost:%s" (include "coeffd.port.otlpGrpc" .) | quote }}
{{- end }}
- --enable-journey-tracing
- --journey-tracing-sample-rate
- {{ $t.journeyTracingSampleRate | toString | quote }}
- --step-tracing-enabled
- --step-tracing-sample-rate
- {{ $t.stepTracingSampleRate | toString | quote }}
- --step-tracing-rich-subsample-rate
- {{ $t.stepTracingRichSubsampleRate | toString | quote }}
{{- if $t.kvEvents }}
- --kv-events-config
- {{ dict "enable_kv_cache_events" true "publisher" "zmq" "endpoint" $t.kvEventsEndpoint | toJson | quote }}
{{- end }}
{{- end -}}

{{/*
vLLM env: OTLP protocol/plaintext, service name, and the configuration as coeffd.*
resource attributes (vocabulary of coeffd/learners/features/config.py), so the same pod can
also be routed through a collector to a fleet.
*/}}
{{- define "coeffd.vllmEnv" -}}
{{- $c := .values.settings.configuration | default dict -}}
{{- $t := .values.sidecar.vllm -}}
{{- $attrs := list -}}
{{- if $c.model }}{{ $attrs = append $attrs (printf "coeffd.model=%s" $c.model) }}{{ end -}}
{{- $gpu := $c.gpu | default $c.hardware -}}
{{- if $gpu }}{{ $attrs = append $attrs (printf "coeffd.gpu=%s" $gpu) }}{{ end -}}
{{- range $key := list "tp" "dp" "ep" "moe_comm_backend" "vllm_version" "max_num_batched_tokens" "max_num_seqs" "max_model_len" "chunked_prefill" "prefix_caching" "cpu_offload_gib" "block_size" "async_scheduling" "kv_cache_dtype" }}
{{- if and (hasKey $c $key) (not (kindIs "invalid" (get $c $key))) }}
{{- $attrs = append $attrs (printf "coeffd.%s=%s" $key (include "coeffd.attrValue" (get $c $key))) }}
{{- end }}
{{- end -}}
- name: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
  value: {{ $t.otlpProtocol | quote }}
{{- $tlsv := (.values.security | default dict).tls | default dict -}}
{{- $used := ternary "otlp_http" "otlp_grpc" (eq $t.otlpProtocol "http/protobuf") -}}
{{- if and $tlsv.secretName (has $used $tlsv.listeners) -}}
{{- fail (printf "coeffd: security.tls covers %s, which vLLM exports to over localhost in plaintext (OTEL_EXPORTER_OTLP_TRACES_INSECURE); in sidecar mode list only http in security.tls.listeners" $used) -}}
{{- end }}
- name: OTEL_EXPORTER_OTLP_TRACES_INSECURE
  value: "true"
- name: OTEL_SERVICE_NAME
  value: {{ include "coeffd.vllmServiceName" . | quote }}
{{- if $attrs }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attrs | quote }}
{{- end }}
- name: OTEL_EXPERIMENTAL_RESOURCE_DETECTORS
  value: "otel,process"
{{- $tok := (.values.security | default dict).token | default dict -}}
{{- if and $tok.secretName (has (ternary "otlp_http" "otlp_grpc" (eq $t.otlpProtocol "http/protobuf")) $tok.listeners) }}
# The sidecar's bearer token, from the same Secret (URL-encoded space, as
# OTEL_EXPORTER_OTLP_HEADERS wants; use a URL-safe token, e.g. openssl rand -hex 32).
- name: COEFFD_OTLP_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $tok.secretName }}
      key: {{ $tok.key }}
- name: OTEL_EXPORTER_OTLP_TRACES_HEADERS
  value: "authorization=Bearer%20$(COEFFD_OTLP_TOKEN)"
{{- end }}
{{- if $t.spanEventCountLimit }}
- name: OTEL_SPAN_EVENT_COUNT_LIMIT
  value: {{ int64 $t.spanEventCountLimit | quote }}
{{- end }}
{{- end -}}

{{- define "coeffd.attrValue" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- if eq (floor .) (float64 .) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}{{ . }}{{- end -}}
{{- end -}}
