{{/* The release's base name. */}}
{{- define "tessel.fullname" -}}
{{- printf "%s-tessel" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "tessel.labels" -}}
app.kubernetes.io/name: tessel
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tessel.selector" -}}
app.kubernetes.io/name: tessel
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tessel.coordinator" -}}{{ include "tessel.fullname" . }}-coordinator{{- end -}}
{{- define "tessel.coordinatorHeadless" -}}{{ include "tessel.fullname" . }}-coordinator-peers{{- end -}}
{{- define "tessel.worker" -}}{{ include "tessel.fullname" . }}-worker{{- end -}}
{{- define "tessel.tlsSecret" -}}{{ .Values.tls.existingSecret | default (printf "%s-tls" (include "tessel.fullname" .)) }}{{- end -}}

{{/* The coordinators as clients dial them. */}}
{{- define "tessel.coordinatorAddrs" -}}
{{- $c := include "tessel.coordinator" . -}}
{{- $h := include "tessel.coordinatorHeadless" . -}}
{{- $out := list -}}
{{- range $i := until (int .Values.coordinators.replicas) -}}
{{- $out = append $out (printf "%s-%d.%s.%s.svc:%d" $c $i $h $.Release.Namespace (int $.Values.coordinators.port)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* The TLS folder every pod mounts: ca.pem, node.pem, node.key. */}}
{{- define "tessel.tlsVolume" -}}
- name: tls
  secret:
    secretName: {{ include "tessel.tlsSecret" . }}
    defaultMode: 0400
    items:
      - {key: ca.crt, path: ca.pem}
      - {key: tls.crt, path: node.pem}
      - {key: tls.key, path: node.key}
{{- end -}}

{{- define "tessel.securityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "tessel.scrape" -}}
{{- if .Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.coordinators.metricsPort | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
