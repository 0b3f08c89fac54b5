{{/* Names: <release>-fairgate unless the release name already contains it. */}}
{{- define "fairgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fairgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's name: <fullname>-<component> (redis, engine). */}}
{{- define "fairgate.componentName" -}}
{{- printf "%s-%s" (include "fairgate.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fairgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component (gateway, redis, engine). */}}
{{- define "fairgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fairgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "fairgate.labels" -}}
helm.sh/chart: {{ include "fairgate.chart" .root }}
{{ include "fairgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: fairgate
{{- end }}

{{/* repository:tag, or repository@digest when a digest is set. */}}
{{- define "fairgate.image" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ .image.tag | default .default }}
{{- end }}
{{- end }}

{{- define "fairgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fairgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the API-key pepper and the admin token. */}}
{{- define "fairgate.authSecretName" -}}
{{- .Values.auth.existingSecret | default (include "fairgate.fullname" .) }}
{{- end }}

{{/*
A generated secret value that survives upgrades: the live Secret's value when
there is one (lookup; empty under `helm template`), else a random one.
Args: root, secret (name), key, length.
*/}}
{{- define "fairgate.keptSecret" -}}
{{- $live := lookup "v1" "Secret" .root.Release.Namespace .secret }}
{{- if and $live (hasKey $live.data .key) }}
{{- index $live.data .key | b64dec }}
{{- else }}
{{- randAlphaNum .length }}
{{- end }}
{{- end }}

{{/* Redis: the Secret and key with its password ("" name: no password). */}}
{{- define "fairgate.redisSecretName" -}}
{{- if .Values.redis.enabled }}
{{- .Values.redis.auth.existingSecret | default (include "fairgate.componentName" (dict "root" . "component" "redis")) }}
{{- else }}
{{- .Values.externalRedis.existingSecret }}
{{- end }}
{{- end }}

{{- define "fairgate.redisSecretKey" -}}
{{- if .Values.redis.enabled }}
{{- .Values.redis.auth.existingSecretPasswordKey }}
{{- else }}
{{- .Values.externalRedis.existingSecretPasswordKey }}
{{- end }}
{{- end }}

{{/* FAIRGATE_REDIS_URL; $(REDIS_PASSWORD) is expanded by the kubelet from the env before it. */}}
{{- define "fairgate.redisUrl" -}}
{{- $auth := ternary ":$(REDIS_PASSWORD)@" "" (ne (include "fairgate.redisSecretName" .) "") }}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s%s.%s.svc:6379/0" $auth (include "fairgate.componentName" (dict "root" . "component" "redis")) .Release.Namespace }}
{{- else }}
{{- with .Values.externalRedis }}
{{- printf "%s://%s%s:%d/%d" (ternary "rediss" "redis" .tls) $auth .host (int .port) (int .db) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
FAIRGATE_SGLANG_URLS: every in-chart engine pod by its stable name (the
StatefulSet's headless Service), so fairgate's pool health-checks, balances
and ejects each worker; or the external URLs.
*/}}
{{- define "fairgate.engineUrls" -}}
{{- if eq .Values.engine.mode "external" }}
{{- join "," .Values.engine.external.urls }}
{{- else }}
{{- $spec := ternary .Values.engine.sglang .Values.engine.standIn (eq .Values.engine.mode "sglang") }}
{{- $name := include "fairgate.componentName" (dict "root" . "component" "engine") }}
{{- $urls := list }}
{{- range $i := until (int $spec.replicas) }}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc:%d" $name $i $name $.Release.Namespace (int $spec.port)) }}
{{- end }}
{{- join "," $urls }}
{{- end }}
{{- end }}

{{/*
FAIRGATE_REPLICAS: the most pods the fleet may run (the HPA's maximum). A
replica's fail-open limits divide by max(this, replicas seen alive in Redis).
*/}}
{{- define "fairgate.fleetReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ .Values.autoscaling.maxReplicas }}{{ else }}{{ .Values.replicaCount }}{{ end }}
{{- end }}

{{/* A settings value as its env string (numbers without exponents). */}}
{{- define "fairgate.envValue" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/* Cross-field checks JSON Schema cannot express (values.schema.json has the rest). */}}
{{- define "fairgate.validate" -}}
{{- $v := .Values }}
{{- $minPods := ternary $v.autoscaling.minReplicas $v.replicaCount $v.autoscaling.enabled }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas must be <= autoscaling.maxReplicas" }}
{{- end }}
{{- if and $v.podDisruptionBudget.enabled (not (kindIs "string" $v.podDisruptionBudget.minAvailable)) (ge (int $v.podDisruptionBudget.minAvailable) (int $minPods)) }}
{{- fail (printf "podDisruptionBudget.minAvailable (%d) must be below the smallest replica count (%d), or no pod can ever be evicted (node drains block)" (int $v.podDisruptionBudget.minAvailable) (int $minPods)) }}
{{- end }}
{{- $ports := list 50051 (int $v.metrics.port) }}
{{- if $v.http.enabled }}{{ $ports = append $ports (int $v.http.port) }}{{ end }}
{{- if ne (len $ports) (len (uniq $ports)) }}
{{- fail (printf "gRPC (50051), metrics.port and http.port must differ: %v" $ports) }}
{{- end }}
{{- end }}

{{/*
The wait-for-engine init container's program: fairgate exits at start when no
engine answers, and SGLang takes minutes to load a model; waiting here keeps
the pods out of CrashLoopBackOff. Done when any FAIRGATE_SGLANG_URLS answers /health.
*/}}
{{- define "fairgate.waitForEngineScript" -}}
import os, time, urllib.request
urls = os.environ["FAIRGATE_SGLANG_URLS"].split(",")
while True:
    for url in urls:
        try:
            urllib.request.urlopen(url + "/health", timeout=3).close()
            print("engine ready:", url, flush=True)
            raise SystemExit(0)
        except OSError as exc:
            last = f"{url}: {exc}"
    print("waiting for an engine;", last, flush=True)
    time.sleep(5)
{{- end }}
