{{/*
TOML from a values map. Helm hands templates every YAML number as float64 (and
toToml would print `tp = 1.0`, `1e+09`), so scalars are written here: whole numbers
as integers (pydantic float fields accept them), other floats as Go prints them,
strings JSON-quoted (JSON escapes are valid TOML basic-string escapes), lists
inline. Keys of a table come before its sub-tables, as TOML requires; null values
are omitted, which lets a user unset a default with `--set settings.x.y=null`.
Call with (dict "path" "" "map" $m).
*/}}
{{- define "coeffd.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "coeffd.toml.scalar" -}}
{{- if kindIs "string" . -}}{{ toJson . }}
{{- else if kindIs "bool" . -}}{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "float32" .) -}}
{{- if eq (floor .) (float64 .) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else if or (kindIs "int" .) (kindIs "int64" .) -}}{{ . }}
{{- else if kindIs "slice" . -}}
[{{- range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "coeffd.toml.scalar" $v }}{{ end -}}]
{{- else if kindIs "map" . -}}
{ {{- range $i, $k := keys . | sortAlpha }}{{ if $i }},{{ end }} {{ include "coeffd.toml.key" $k }} = {{ include "coeffd.toml.scalar" (get $ $k) }}{{ end }} }
{{- else -}}{{ fail (printf "coeffd: cannot write %v (%s) as TOML" . (kindOf .)) }}
{{- end -}}
{{- end -}}

{{- define "coeffd.toml.table" -}}
{{- $path := .path -}}
{{- $m := .map -}}
{{- range $k := keys $m | sortAlpha -}}
{{- $v := get $m $k -}}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ include "coeffd.toml.key" $k }} = {{ include "coeffd.toml.scalar" $v }}
{{- end -}}
{{- end -}}
{{- range $k := keys $m | sortAlpha -}}
{{- $v := get $m $k -}}
{{- if kindIs "map" $v -}}
{{- $sub := ternary (include "coeffd.toml.key" $k) (printf "%s.%s" $path (include "coeffd.toml.key" $k)) (eq $path "") }}

[{{ $sub }}]
{{- include "coeffd.toml.table" (dict "path" $sub "map" $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The whole config.toml of a coeffd instance, from .values.settings. */}}
{{- define "coeffd.configToml" -}}
# Rendered by the coeffd Helm chart from .Values.settings (keys as in config.example.toml).
{{- include "coeffd.toml.table" (dict "path" "" "map" .values.settings) }}
{{ end -}}
