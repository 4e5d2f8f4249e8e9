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

{{/* The TLS folder every pod mounts (ca.pem, node.pem, node.key), for
(dict "root" $ "role" coordinator|worker|client "dns" list). perPod:
cert-manager's csi-driver issues the pod a certificate of its own, naming
its role and its pod name (tessel://ROLE/POD), renewed in place, the key
never leaving the node; shared: one Secret for every pod. */}}
{{- define "tessel.tlsVolume" -}}
{{- $ := .root -}}
{{- include "tessel.tlsCheck" $ -}}
{{- if eq $.Values.tls.mode "perPod" }}
- name: tls
  csi:
    driver: csi.cert-manager.io
    readOnly: true
    volumeAttributes:
      csi.cert-manager.io/issuer-name: {{ include "tessel.fullname" $ }}-ca
      csi.cert-manager.io/issuer-kind: Issuer
      csi.cert-manager.io/common-name: "{{ .role }} ${POD_NAME}"
      csi.cert-manager.io/uri-sans: "tessel://{{ .role }}/${POD_NAME}"
      csi.cert-manager.io/dns-names: {{ join "," (prepend (.dns | default list) "tessel") | quote }}
      {{- if ne .role "client" }}
      csi.cert-manager.io/ip-sans: "127.0.0.1"
      csi.cert-manager.io/key-usages: "digital signature,server auth,client auth"
      {{- else }}
      csi.cert-manager.io/key-usages: "digital signature,client auth"
      {{- end }}
      csi.cert-manager.io/duration: {{ $.Values.tls.certManager.duration | quote }}
      csi.cert-manager.io/ca-file: ca.pem
      csi.cert-manager.io/certificate-file: node.pem
      csi.cert-manager.io/privatekey-file: node.key
      # The driver writes the files root-owned, mode 0440: the pod's group.
      csi.cert-manager.io/fs-group: "10001"
{{- else }}
- name: tls
  secret:
    secretName: {{ include "tessel.tlsSecret" $ }}
    defaultMode: 0400
    items:
      - {key: ca.crt, path: ca.pem}
      - {key: tls.crt, path: node.pem}
      - {key: tls.key, path: node.key}
{{- end }}
{{- with $.Values.tls.trustBundle.configMap }}
- name: trust
  configMap:
    name: {{ . }}
    items:
      - {key: {{ $.Values.tls.trustBundle.key }}, path: ca.pem}
{{- end }}
{{- end -}}

{{/* The TLS arguments of every tessel process. */}}
{{- define "tessel.tlsArgs" -}}
- --tls-dir
- /tls
{{- if .Values.tls.trustBundle.configMap }}
- --tls-ca
- /trust/ca.pem
{{- end }}
{{- end -}}

{{/* The TLS mounts of every tessel container. */}}
{{- define "tessel.tlsMounts" -}}
- {name: tls, mountPath: /tls, readOnly: true}
{{- if .Values.tls.trustBundle.configMap }}
- {name: trust, mountPath: /trust, readOnly: true}
{{- end }}
{{- end -}}

{{/* Refuses TLS values that cannot work together. */}}
{{- define "tessel.tlsCheck" -}}
{{- if and (eq .Values.tls.mode "perPod") (not .Values.tls.certManager.enabled) -}}
{{- fail "tls.mode=perPod needs cert-manager and its csi-driver (tls.certManager.enabled=true); without them set tls.mode=shared and tls.existingSecret" -}}
{{- end -}}
{{- if and (eq .Values.tls.mode "perPod") .Values.tls.existingSecret -}}
{{- fail "tls.existingSecret is the shared mode's certificate: set tls.mode=shared to use it (every pod then acts as any node), or leave it empty" -}}
{{- end -}}
{{- end -}}

{{/* Every pod's security context: Pod Security "restricted" (non-root,
seccomp RuntimeDefault); fsGroup makes the kubelet give the Secret's
files (root-owned, defaultMode 0400) group 10001 and group read. */}}
{{- define "tessel.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Pod-level settings every pod shares: no service account token (no
pod talks to the Kubernetes API) and no service variables. */}}
{{- define "tessel.podBasics" -}}
automountServiceAccountToken: false
enableServiceLinks: false
securityContext:
  {{- include "tessel.podSecurityContext" . | nindent 2 }}
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

{{/* A TPU slice's shape from GKE's accelerator type and topology, as JSON
{"chips": per pod, "hosts": pods per slice}. v4 and v5p hosts have 4
chips; v5e and v6e slices of up to 8 chips are one host with all of them,
larger ones hosts of 4 (the table in README.md). */}}
{{- define "tessel.tpuShape" -}}
{{- $t := .Values.workers.tpu -}}
{{- $type := required "workers.tpu.acceleratorType is required for TPU pools" $t.acceleratorType -}}
{{- $topo := required "workers.tpu.topology is required for TPU pools" $t.topology -}}
{{- if not (regexMatch "^[1-9][0-9]*(x[1-9][0-9]*){1,2}$" $topo) -}}
{{- fail (printf "workers.tpu.topology %q: expected AxB or AxBxC" $topo) -}}
{{- end -}}
{{- $chips := 1 -}}
{{- range (splitList "x" $topo) }}{{ $chips = mul $chips (int .) }}{{ end -}}
{{- $dims := len (splitList "x" $topo) -}}
{{- $perHost := 4 -}}
{{- if has $type (list "tpu-v4-podslice" "tpu-v5p-slice") -}}
{{- if ne $dims 3 }}{{ fail (printf "workers.tpu.topology %q: %s slices are 3-D (AxBxC)" $topo $type) }}{{ end -}}
{{- else if has $type (list "tpu-v5-lite-podslice" "tpu-v5-lite-device" "tpu-v6e-slice") -}}
{{- if ne $dims 2 }}{{ fail (printf "workers.tpu.topology %q: %s slices are 2-D (AxB)" $topo $type) }}{{ end -}}
{{- if le $chips 8 }}{{ $perHost = $chips }}{{ end -}}
{{- else -}}
{{- fail (printf "workers.tpu.acceleratorType %q: not one of tpu-v4-podslice, tpu-v5p-slice, tpu-v5-lite-podslice, tpu-v5-lite-device, tpu-v6e-slice (the chart derives hosts per slice from it)" $type) -}}
{{- end -}}
{{- if ne (mod $chips $perHost) 0 -}}
{{- fail (printf "workers.tpu.topology %q has %d chips, not a multiple of %d per host" $topo $chips $perHost) -}}
{{- end -}}
{{- dict "chips" $perHost "hosts" (div $chips $perHost) | toJson -}}
{{- end -}}

{{/* The workers' shape, checked, as JSON {"slices", "perSlice", "chips"}:
every inconsistency fails the render with the value to set. */}}
{{- define "tessel.workerShape" -}}
{{- $w := .Values.workers -}}
{{- $count := int $w.count -}}
{{- if lt $count 1 }}{{ fail "workers.count must be at least 1" }}{{ end -}}
{{- $slices := 1 -}}
{{- $perSlice := $count -}}
{{- $chips := 0 -}}
{{- if eq $w.accelerator "tpu" -}}
{{- $shape := include "tessel.tpuShape" . | fromJson -}}
{{- $slices = int ($w.tpu.slices | default 1) -}}
{{- $perSlice = int $shape.hosts -}}
{{- $chips = int $shape.chips -}}
{{- if ne $count (mul $slices $perSlice) -}}
{{- fail (printf "workers.count is %d, but %d slice(s) of %s %s take %d hosts each: set workers.count=%d" $count $slices $w.tpu.acceleratorType $w.tpu.topology $perSlice (mul $slices $perSlice)) -}}
{{- end -}}
{{- if and $w.tpu.count (ne (int $w.tpu.count) $chips) -}}
{{- fail (printf "workers.tpu.count is %d, but a %s %s host has %d chips: leave it unset or set %d" (int $w.tpu.count) $w.tpu.acceleratorType $w.tpu.topology $chips $chips) -}}
{{- end -}}
{{- end -}}
{{- $grace := int $w.terminationGracePeriodSeconds -}}
{{- if le (mul $grace 1000) (int $w.preemptGraceMs) -}}
{{- fail (printf "workers.terminationGracePeriodSeconds (%d s) must exceed workers.preemptGraceMs (%d ms): the kubelet's SIGKILL would cut the preemption short" $grace (int $w.preemptGraceMs)) -}}
{{- end -}}
{{- dict "slices" $slices "perSlice" $perSlice "chips" $chips | toJson -}}
{{- end -}}
