{{/*
Every helper takes a context dict (dict "root" $ "values" <coeffd values>) rather than
the chart root, so that a vLLM chart that has coeffd as a subchart can call the
sidecar templates with (dict "root" $ "values" .Values.coeffd) and get the same
names as the subchart's own ConfigMap.
*/}}

{{- define "coeffd.name" -}}
{{- default "coeffd" .values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coeffd.fullname" -}}
{{- if .values.fullnameOverride -}}
{{- .values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "coeffd.name" . -}}
{{- if contains $name .root.Release.Name -}}
{{- .root.Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .root.Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "coeffd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coeffd.name" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "coeffd.labels" -}}
{{ include "coeffd.selectorLabels" . }}
{{- $chart := include "coeffd.chart" . | fromJson }}
helm.sh/chart: {{ printf "%s-%s" $chart.name $chart.version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ include "coeffd.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: coeffd
{{- end -}}

{{/*
The coeffd chart's own metadata, also when a parent (vLLM) chart renders the sidecar
templates with its own root: then it is the "coeffd" subchart's.
*/}}
{{- define "coeffd.chart" -}}
{{- $chart := .root.Chart -}}
{{- if and (ne .root.Chart.Name "coeffd") .root.Subcharts (hasKey .root.Subcharts "coeffd") -}}
{{- $chart = (index .root.Subcharts "coeffd").Chart -}}
{{- end -}}
{{- toJson (dict "name" $chart.Name "version" $chart.Version "appVersion" $chart.AppVersion) -}}
{{- end -}}

{{/* The image tag: values.image.tag, else the chart's appVersion (one place to bump). */}}
{{- define "coeffd.imageTag" -}}
{{- .values.image.tag | default (include "coeffd.chart" . | fromJson).appVersion -}}
{{- end -}}

{{- define "coeffd.image" -}}
{{- printf "%s:%s" .values.image.repository (include "coeffd.imageTag" .) -}}
{{- end -}}

{{- define "coeffd.serviceAccountName" -}}
{{- if .values.serviceAccount.create -}}
{{- default (include "coeffd.fullname" .) .values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "coeffd.headlessName" -}}
{{- printf "%s-headless" (include "coeffd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
=== The query tier (query.enabled) ===
Its own app.kubernetes.io/name ("<name>-query"), so the fleet's selectors (Service,
headless Service, PDB, NetworkPolicy: name + instance) never match a query pod, and the
query tier never resolves itself as a peer.
*/}}
{{- define "coeffd.queryName" -}}
{{- printf "%s-query" (include "coeffd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coeffd.query.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-query" (include "coeffd.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: query
{{- end -}}

{{- define "coeffd.query.labels" -}}
{{ include "coeffd.query.selectorLabels" . }}
{{- $chart := include "coeffd.chart" . | fromJson }}
helm.sh/chart: {{ printf "%s-%s" $chart.name $chart.version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ include "coeffd.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: coeffd
{{- end -}}

{{/* Sidecar mode: the headless Service over the vLLM pods' coeffd API port. */}}
{{- define "coeffd.peersName" -}}
{{- printf "%s-peers" (include "coeffd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels the vLLM chart puts on its pod template (sidecar mode) so that the query tier's
peers Service and the optional PodMonitor find the pods that carry a coeffd sidecar:

    template:
      metadata:
        labels:
          {{- include "coeffd.sidecarPodLabels" (dict "root" $ "values" .Values.coeffd) | nindent 8 }}
*/}}
{{- define "coeffd.sidecarPodLabels" -}}
coeffd/sidecar: {{ include "coeffd.fullname" . }}
{{- end -}}

{{/* matchLabels of the pods with a coeffd sidecar: sidecar.podSelector, else the above. */}}
{{- define "coeffd.sidecarSelector" -}}
{{- with .values.sidecar.podSelector }}{{ toYaml . }}{{ else }}{{ include "coeffd.sidecarPodLabels" . }}{{ end -}}
{{- end -}}
