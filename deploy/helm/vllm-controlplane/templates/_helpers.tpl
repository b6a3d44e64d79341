{{/* Names, labels and the values checks every template relies on. */}}

{{- define "cp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "cp.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "cp.labels" -}}
helm.sh/chart: {{ include "cp.chart" . }}
{{ include "cp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vllm-controlplane
{{- end -}}

{{/* The `helm test` pod's labels: not the controller's, so that no Service or PodDisruptionBudget selects it. */}}
{{- define "cp.testSelectorLabels" -}}
app.kubernetes.io/name: {{ include "cp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: helm-test
{{- end -}}

{{- define "cp.redis.fullname" -}}
{{- printf "%s-valkey" (include "cp.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cp.redis.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end -}}

{{- define "cp.redis.labels" -}}
helm.sh/chart: {{ include "cp.chart" . }}
{{ include "cp.redis.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.redis.bundled.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vllm-controlplane
{{- end -}}

{{- define "cp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cp.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "cp.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "cp.authSecretName" -}}
{{- default (printf "%s-auth" (include "cp.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "cp.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "cp.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{- define "cp.redisSecretName" -}}
{{- default (printf "%s-redis" (include "cp.fullname" .)) .Values.redis.existingSecret -}}
{{- end -}}

{{/* The external Redis is configured (a URL or a Secret holding one). */}}
{{- define "cp.redis.external" -}}
{{- if or .Values.redis.url .Values.redis.existingSecret -}}true{{- end -}}
{{- end -}}

{{/*
Cross-field checks the schema cannot express; each failure names the values to change.
*/}}
{{- define "cp.validate" -}}
{{- $external := include "cp.redis.external" . -}}
{{- if and $external .Values.redis.bundled.enabled -}}
{{- fail "redis: set either redis.url/redis.existingSecret (an external Redis) or redis.bundled.enabled=true, not both" -}}
{{- end -}}
{{- if and (not $external) (not .Values.redis.bundled.enabled) -}}
{{- fail "redis: the controller needs a Redis: set redis.url (or redis.existingSecret) or redis.bundled.enabled=true" -}}
{{- end -}}
{{- if and .Values.redis.url .Values.redis.existingSecret -}}
{{- fail "redis: set redis.url or redis.existingSecret, not both" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) (or (not .Values.tls.cert) (not .Values.tls.key)) -}}
{{- fail "tls: tls.enabled needs tls.existingSecret or both tls.cert and tls.key" -}}
{{- end -}}
{{- if and .Values.tls.enabled .Values.tls.mutual (not .Values.tls.existingSecret) (not .Values.tls.ca) -}}
{{- fail "tls: tls.mutual needs tls.ca (or a tls.existingSecret with ca.crt)" -}}
{{- end -}}
{{- if and .Values.tls.mutual (not .Values.tls.enabled) -}}
{{- fail "tls: tls.mutual needs tls.enabled=true" -}}
{{- end -}}
{{- if and (not .Values.tls.enabled) (not .Values.allowPlaintext) -}}
{{- fail "tls.enabled is false and allowPlaintext is false: enable TLS or allow plaintext gRPC" -}}
{{- end -}}
{{- $podMonitor := .Values.metrics.enginePodMonitor -}}
{{- if and $podMonitor.enabled (not $podMonitor.selector.matchLabels) (not $podMonitor.selector.matchExpressions) -}}
{{- fail "metrics.enginePodMonitor: set selector.matchLabels or selector.matchExpressions to the engine pods' labels (an empty selector would scrape every pod)" -}}
{{- end -}}
{{- $volumes := list "tmp" -}}
{{- if .Values.tls.enabled -}}{{- $volumes = append $volumes "tls" -}}{{- end -}}
{{- range .Values.controller.extraVolumes -}}
{{- if has .name $volumes -}}
{{- fail (printf "controller.extraVolumes: the volume name %q is taken (the chart's own: tmp, tls)" .name) -}}
{{- end -}}
{{- $volumes = append $volumes .name -}}
{{- end -}}
{{- range .Values.controller.extraVolumeMounts -}}
{{- if not (has .name $volumes) -}}
{{- fail (printf "controller.extraVolumeMounts: %q names no volume of the pod (add it to controller.extraVolumes)" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Arguments of the cp-grpc-health check (exec probes, used when TLS is on): the first CA file that exists. */}}
{{- define "cp.healthCheckCommand" -}}
- cp-grpc-health
- --address=127.0.0.1:{{ .Values.controller.grpcPort }}
{{ include "cp.healthCheckTlsArgs" . }}
{{- end -}}

{{/* cp-grpc-health's TLS arguments with the chart's Secret mounted at /etc/controlplane/tls. */}}
{{- define "cp.healthCheckTlsArgs" -}}
- --tls-ca=/etc/controlplane/tls/ca.crt
- --tls-ca=/etc/controlplane/tls/tls.crt
- --tls-server-name={{ default (printf "%s.%s.svc" (include "cp.fullname" .) .Release.Namespace) .Values.tls.serverName }}
{{- if .Values.tls.mutual }}
- --tls-client-cert=/etc/controlplane/tls/tls.crt
- --tls-client-key=/etc/controlplane/tls/tls.key
{{- end }}
{{- end -}}
