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
app.kubernetes.io/version: {{ .values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: coeffd
{{- end -}}

{{- define "coeffd.image" -}}
{{- printf "%s:%s" .values.image.repository .values.image.tag -}}
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
