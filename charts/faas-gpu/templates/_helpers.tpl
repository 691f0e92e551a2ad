{{/* The faas-gpu image. */}}
{{- define "faas-gpu.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "faas-gpu.labels" -}}
app.kubernetes.io/name: faas-gpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* Selector labels of one component: include with (dict "root" . "component" "gpuserver"). */}}
{{- define "faas-gpu.selector" -}}
app.kubernetes.io/name: faas-gpu
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* URL of NATS JetStream. */}}
{{- define "faas-gpu.natsURL" -}}
{{- if .Values.nats.enabled -}}
nats://{{ .Release.Name }}-nats.{{ .Release.Namespace }}.svc:4222
{{- else -}}
{{- required "nats.external.url is required when nats.enabled is false" .Values.nats.external.url -}}
{{- end -}}
{{- end }}

{{/* Name of the Secret holding the NATS password (key nats-password); empty when NATS takes no credentials. */}}
{{- define "faas-gpu.natsSecret" -}}
{{- if .Values.nats.auth.secretName -}}
{{ .Values.nats.auth.secretName }}
{{- else if .Values.nats.enabled -}}
{{ .Release.Name }}-nats-auth
{{- end -}}
{{- end }}

{{/* The Secret holding the gpuservers' shared key. */}}
{{- define "faas-gpu.keySecret" -}}
{{- if .Values.gpuserver.keySecret -}}
{{ .Values.gpuserver.keySecret }}
{{- else -}}
{{ .Release.Name }}-gpuserver-key
{{- end -}}
{{- end }}

{{/* The Secret holding the provider API's basic-auth credentials, or "" when there is none. */}}
{{- define "faas-gpu.basicAuthSecret" -}}
{{- if .Values.basicAuth.enabled -}}
{{- if .Values.basicAuth.secretName -}}
{{ .Values.basicAuth.secretName }}
{{- else if .Values.provider.enabled -}}
{{ .Release.Name }}-basic-auth
{{- end -}}
{{- end -}}
{{- end }}

{{/* The Secret holding the credentials of the gpuserver's pool page; fails when the page is on and there is none. */}}
{{- define "faas-gpu.uiAuthSecret" -}}
{{- $s := .Values.gpuserver.ui.secretName | default (include "faas-gpu.basicAuthSecret" .) -}}
{{- if not $s -}}
{{- fail "gpuserver.ui.enabled: the pool page is served behind basic auth; set gpuserver.ui.secretName, or basicAuth.secretName (e.g. basic-auth beside the stock openfaas chart), or provider.enabled with basicAuth.enabled" -}}
{{- end -}}
{{ $s }}
{{- end }}

{{/* The gpuserver's settings as FAAS_GPU_* variables (a ConfigMap; its checksum rolls the DaemonSet). */}}
{{- define "faas-gpu.gpuserverEnv" -}}
FAAS_GPU_SOCKET: {{ printf "%s/%s" .Values.socketDir .Values.gpuserver.controlSocket | quote }}
FAAS_GPU_REMOTING_SOCKET: {{ printf "%s/%s" .Values.socketDir .Values.gpuserver.remotingSocket | quote }}
FAAS_GPU_REPOSITORY_DIR: {{ .Values.gpuserver.repositoryDir | quote }}
FAAS_GPU_KEY_FILE: "/var/run/secrets/faas-gpu-key/gpuserver.key"
FAAS_GPU_SOCKET_GROUP: {{ .Values.gpuserver.socketGroup | quote }}
FAAS_GPU_LOG_LEVEL: {{ .Values.gpuserver.logLevel | quote }}
FAAS_GPU_GPUS: {{ required "gpuserver.gpus is required" .Values.gpuserver.gpus | quote }}
FAAS_GPU_OVERLOAD: {{ .Values.gpuserver.overload | default "auto" | toString | quote }}
FAAS_GPU_MAX_BINDING_HOLD: {{ .Values.gpuserver.maxBindingHold | default "2m" | toString | quote }}
{{- if .Values.gpuserver.metricsPort }}
FAAS_GPU_LISTEN: {{ printf ":%d" (int .Values.gpuserver.metricsPort) | quote }}
{{- end }}
{{- if .Values.gpuserver.ui.enabled }}
FAAS_GPU_UI_ADDR: {{ printf ":%d" (int .Values.gpuserver.ui.port) | quote }}
FAAS_GPU_UI_AUTH_DIR: "/var/secrets"
{{- end }}
{{- range $k, $v := .Values.gpuserver.extraEnv }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by the control-plane pods. */}}
{{- define "faas-gpu.controlPlanePod" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
