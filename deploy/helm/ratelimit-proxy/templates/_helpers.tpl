{{/* The chart's name, or nameOverride. */}}
{{- define "rlp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, else the release's name (with the chart's unless it holds it). */}}
{{- define "rlp.fullname" -}}
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

{{- define "rlp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: ratelimit-proxy
{{ include "rlp.selectorLabels" . }}
{{- end -}}

{{/* The labels that select the gateway's pods: its own in deployment mode, the workload's in sidecar mode. */}}
{{- define "rlp.selectorLabels" -}}
{{- if eq .Values.mode "sidecar" -}}
{{- if not .Values.sidecar.podSelector -}}
{{- fail "sidecar.podSelector: the labels of the workload's pods (sidecar mode)" -}}
{{- end -}}
{{- toYaml .Values.sidecar.podSelector -}}
{{- else -}}
app.kubernetes.io/name: {{ include "rlp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- end -}}

{{/* Labels of the chart's own objects in sidecar mode (never the workload's selector labels on a Service it does not own). */}}
{{- define "rlp.objectLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: ratelimit-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rlp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rlp.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rlp.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The store block of the configuration: the backend's settings, without the chart's own keys or empty values. */}}
{{- define "rlp.store" -}}
{{- $s := omit .Values.store "dynamodb" "redis" -}}
{{- if eq .Values.store.backend "dynamodb" -}}
{{- $_ := set $s "dynamodb" (include "rlp.compact" .Values.store.dynamodb | fromYaml) -}}
{{- else if eq .Values.store.backend "redis" -}}
{{- $r := include "rlp.compact" (omit .Values.store.redis "passwordSecret") | fromYaml -}}
{{- if and .Values.store.redis.passwordSecret.name (not .Values.store.redis.password_env) -}}
{{- fail "store.redis.passwordSecret needs store.redis.password_env: the variable the gateway reads the password from" -}}
{{- end -}}
{{- $_ := set $s "redis" $r -}}
{{- end -}}
{{- toYaml (include "rlp.compact" $s | fromYaml) -}}
{{- end -}}

{{/* A map without its empty values (unset settings keep the gateway's defaults). */}}
{{- define "rlp.compact" -}}
{{- $out := dict -}}
{{- range $k, $v := . -}}
{{- if or (kindIs "bool" $v) (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) $v -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The gateway's configuration file: config, with the ports, the store, RLS and telemetry the chart's values set. */}}
{{- define "rlp.config" -}}
{{- $c := deepCopy .Values.config -}}
{{- $_ := set $c "admin_listen" (printf ":%d" (int .Values.ports.admin)) -}}
{{- if .Values.proxy.enabled -}}
{{- $_ := set $c "listen" (printf ":%d" (int .Values.ports.http)) -}}
{{- $_ := set $c "upstream" (required "proxy.upstream: the service the gateway guards" .Values.proxy.upstream) -}}
{{- end -}}
{{- if .Values.rls.enabled -}}
{{- $r := dict "listen" (printf ":%d" (int .Values.ports.rls)) -}}
{{- if and .Values.rls.rules .Values.rls.rulesConfigMap -}}
{{- fail "rls.rules or rls.rulesConfigMap: both name the rule files" -}}
{{- end -}}
{{- if or .Values.rls.rules .Values.rls.rulesConfigMap -}}
{{- $_ := set $r "config_dir" "/etc/ratelimit-proxy/rules" -}}
{{- end -}}
{{- if .Values.rls.responseHeaders -}}
{{- $_ := set $r "response_headers" .Values.rls.responseHeaders -}}
{{- end -}}
{{- $_ := set $c "rls" $r -}}
{{- end -}}
{{- if not (or .Values.proxy.enabled .Values.rls.enabled) -}}
{{- fail "proxy.enabled or rls.enabled: the gateway serves nothing" -}}
{{- end -}}
{{- if .Values.tls.secretName -}}
{{- $_ := set $c "tls" (merge (dict "cert_file" "/etc/ratelimit-proxy/tls/tls.crt" "key_file" "/etc/ratelimit-proxy/tls/tls.key") (default dict .Values.config.tls)) -}}
{{- end -}}
{{- $_ := set $c "store" (include "rlp.store" . | fromYaml) -}}
{{- if .Values.telemetry.otlp.endpoint -}}
{{- $_ := set $c "telemetry" .Values.telemetry -}}
{{- end -}}
{{- toYaml $c -}}
{{- end -}}

{{/* The gateway's container (the Deployment's, or the one a sidecar patch adds). */}}
{{- define "rlp.container" -}}
name: ratelimit-proxy
image: {{ include "rlp.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args: ["serve", "--config", "/etc/ratelimit-proxy/config/config.yaml"]
ports:
{{- if .Values.proxy.enabled }}
  - {name: http, containerPort: {{ .Values.ports.http }}, protocol: TCP}
{{- end }}
{{- if .Values.rls.enabled }}
  - {name: grpc-rls, containerPort: {{ .Values.ports.rls }}, protocol: TCP}
{{- end }}
  - {name: metrics, containerPort: {{ .Values.ports.admin }}, protocol: TCP}
{{- $env := list }}
{{- if and (eq .Values.store.backend "redis") .Values.store.redis.passwordSecret.name }}
{{- $env = append $env (dict "name" .Values.store.redis.password_env "valueFrom" (dict "secretKeyRef" (dict "name" .Values.store.redis.passwordSecret.name "key" (default "password" .Values.store.redis.passwordSecret.key)))) }}
{{- end }}
{{- $env = concat $env .Values.env }}
{{- with $env }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
readinessProbe:
  httpGet: {path: /readyz, port: metrics}
  periodSeconds: 2
  failureThreshold: 1
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 10
  failureThreshold: 3
startupProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 2
  failureThreshold: 30
{{- with .Values.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  - {name: ratelimit-proxy-config, mountPath: /etc/ratelimit-proxy/config, readOnly: true}
{{- if and .Values.rls.enabled (or .Values.rls.rules .Values.rls.rulesConfigMap) }}
  - {name: ratelimit-proxy-rules, mountPath: /etc/ratelimit-proxy/rules, readOnly: true}
{{- end }}
{{- if .Values.tls.secretName }}
  - {name: ratelimit-proxy-tls, mountPath: /etc/ratelimit-proxy/tls, readOnly: true}
{{- end }}
{{- end -}}

{{/* The volumes the container mounts: ConfigMaps and Secrets as directories (never subPath, which Kubernetes does not update). */}}
{{- define "rlp.volumes" -}}
- name: ratelimit-proxy-config
  configMap: {name: {{ include "rlp.fullname" . }}}
{{- if and .Values.rls.enabled (or .Values.rls.rules .Values.rls.rulesConfigMap) }}
- name: ratelimit-proxy-rules
  configMap: {name: {{ .Values.rls.rulesConfigMap | default (printf "%s-rules" (include "rlp.fullname" .)) }}}
{{- end }}
{{- if .Values.tls.secretName }}
- name: ratelimit-proxy-tls
  secret: {secretName: {{ .Values.tls.secretName }}}
{{- end }}
{{- end -}}
