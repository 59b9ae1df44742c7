{{/*
Names, labels and values derived once for every template of the chart.
*/}}

{{- define "gpuslice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of every object: "<release>-gpuslice", or the release name when it already says gpuslice. */}}
{{- define "gpuslice.fullname" -}}
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

{{/* Name of one component's objects: fullname + suffix, within 63 characters. */}}
{{- define "gpuslice.componentName" -}}
{{- printf "%s-%s" (include "gpuslice.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component }}
{{- end }}

{{- define "gpuslice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* app.kubernetes.io labels of every object; call with (dict "root" $ "component" "webhook"). */}}
{{- define "gpuslice.labels" -}}
helm.sh/chart: {{ include "gpuslice.chart" .root }}
{{ include "gpuslice.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: gpuslice
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels a component's pods are selected by (stable across upgrades). */}}
{{- define "gpuslice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuslice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The gpuslice image reference: digest wins over tag; the tag defaults to appVersion. */}}
{{- define "gpuslice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The kube-scheduler image: the tag defaults to the cluster's version (vMAJOR.MINOR.PATCH, no vendor suffix). */}}
{{- define "gpuslice.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag }}
{{- if not $tag }}
{{- $tag = regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version }}
{{- if not $tag }}
{{- fail (printf "scheduler.image.tag is empty and the cluster version %q has no vMAJOR.MINOR.PATCH to use; set scheduler.image.tag" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- end }}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag }}
{{- end }}

{{/* The resource prefix with its trailing slash, checked once: every label/annotation/resource name uses it. */}}
{{- define "gpuslice.prefix" -}}
{{- $prefix := required "config.resourcePrefix is required" .Values.config.resourcePrefix }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$" $prefix) }}
{{- fail (printf "config.resourcePrefix %q must be a DNS subdomain such as gpuslice.io (lower case, at least one dot)" $prefix) }}
{{- end }}
{{- $prefix }}
{{- end }}

{{/* The shared configuration as the components read it (schema: docs/configuration.md). */}}
{{- define "gpuslice.configYaml" -}}
{{- $config := deepCopy .Values.config }}
{{- if .Values.scheduler.enabled }}
{{- if and $config.schedulerName (ne $config.schedulerName .Values.scheduler.profileName) }}
{{- fail (printf "config.schedulerName %q differs from scheduler.profileName %q: converted pods would wait for a scheduler that does not exist; leave config.schedulerName empty" $config.schedulerName .Values.scheduler.profileName) }}
{{- end }}
{{- $_ := set $config "schedulerName" .Values.scheduler.profileName }}
{{- end }}
{{- $_ := set $config "resourcePrefix" (include "gpuslice.prefix" .) }}
{{- toYaml (merge (dict "version" "v1") $config) }}
{{- end }}

{{/* Names shared between templates. */}}
{{- define "gpuslice.configMapName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "config") }}{{- end }}
{{- define "gpuslice.webhookName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "webhook") }}{{- end }}
{{- define "gpuslice.webhookTlsSecretName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "webhook-tls") }}{{- end }}
{{- define "gpuslice.devicePluginName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "device-plugin") }}{{- end }}
{{- define "gpuslice.schedulerName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "scheduler") }}{{- end }}

{{/* DNS names the webhook's serving certificate must cover. */}}
{{- define "gpuslice.webhookDnsNames" -}}
{{- $svc := include "gpuslice.webhookName" . }}
{{- $ns := .Release.Namespace }}
{{- toJson (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) }}
{{- end }}

{{/* The pod security context every gpuslice pod shares. */}}
{{- define "gpuslice.podSeccomp" -}}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The ConfigMap volume both components mount, and its mount. */}}
{{- define "gpuslice.configVolume" -}}
- name: config
  configMap:
    name: {{ include "gpuslice.configMapName" . }}
    items:
      - key: config.yaml
        path: config.yaml
{{- end }}
{{- define "gpuslice.configVolumeMount" -}}
- name: config
  mountPath: /etc/gpuslice
  readOnly: true
{{- end }}
