{{/* The broker's namespace: its certificates' names and DNS names name it. */}}
{{- define "rb-broker.namespace" -}}
{{- if ne .Release.Namespace "resource-broker" -}}
{{- fail (printf "install rb-broker in namespace resource-broker (-n resource-broker), not %s: its certificates name it" .Release.Namespace) -}}
{{- end -}}
{{- .Release.Namespace -}}
{{- end -}}

{{- define "rb-broker.policy" -}}
{{- .Values.policy | default (.Files.Get "files/policy.yaml") -}}
{{- end -}}
