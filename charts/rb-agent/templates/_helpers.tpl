{{/* The agent's namespace: its admission policies and RBAC name it. */}}
{{- define "rb-agent.namespace" -}}
{{- if ne .Release.Namespace "resource-broker" -}}
{{- fail (printf "install rb-agent in namespace resource-broker (-n resource-broker), not %s: the agent's admission policies and RBAC name it" .Release.Namespace) -}}
{{- end -}}
{{- .Release.Namespace -}}
{{- end -}}

{{/* The advertised labels as --labels takes them, sorted. */}}
{{- define "rb-agent.labels" -}}
{{- $kv := list -}}
{{- range $k, $v := .Values.labels -}}
{{- $kv = append $kv (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," (sortAlpha $kv) -}}
{{- end -}}
