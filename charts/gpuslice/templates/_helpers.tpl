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

{{/* The gpuslice image reference: digest wins over tag; the tag defaults to appVersion. The project
publishes no image, so there is no default repository: a render without one is refused, saying how to
build and push the image and what to set (the plugin runs as root with kubelet's directories mounted,
so it must be an image the user chose, never one of an unknown publisher). */}}
{{- define "gpuslice.image" -}}
{{- $image := .Values.image }}
{{- if not $image.repository }}
{{- $version := .Chart.AppVersion }}
{{- fail (printf "image.repository is not set: gpuslice publishes no image. Build it from the Dockerfile at the top of the gpuslice repository and push it to a registry your nodes pull from: `make image IMAGE=<registry>/gpuslice:%s && docker push <registry>/gpuslice:%s` (or podman), then install with `--set image.repository=<registry>/gpuslice --set image.tag=%s`, or pin what you pushed with `--set image.digest=sha256:<digest>` instead of the tag" $version $version $version) }}
{{- end }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
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
{{- $_ := set $config.controller "leaseName" (include "gpuslice.controllerLeaseName" .) }}
{{- if eq .Values.mode "dra" }}
{{- $_ := set $config.dra "enabled" true }}
{{- end }}
{{- toYaml (merge (dict "version" "v1") $config) }}
{{- end }}

{{/* Names shared between templates. */}}
{{- define "gpuslice.configMapName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "config") }}{{- end }}
{{- define "gpuslice.webhookName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "webhook") }}{{- end }}
{{- define "gpuslice.webhookTlsSecretName" -}}
{{- if eq .Values.webhook.tls.source "secret" }}
{{- required "webhook.tls.source secret needs webhook.tls.secretName: an existing kubernetes.io/tls Secret in the release namespace" .Values.webhook.tls.secretName }}
{{- else }}
{{- include "gpuslice.componentName" (dict "root" . "component" "webhook-tls") }}
{{- end }}
{{- end }}
{{- define "gpuslice.devicePluginName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "device-plugin") }}{{- end }}
{{- define "gpuslice.controllerName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "controller") }}{{- end }}
{{/* The Lease the controller's replicas elect a leader with, which the webhook reads with pacing on:
config.controller.leaseName, else "<fullname>-controller", so two releases in one namespace never share one. */}}
{{- define "gpuslice.controllerLeaseName" -}}{{ .Values.config.controller.leaseName | default (include "gpuslice.controllerName" .) }}{{- end }}
{{- define "gpuslice.schedulerName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "scheduler") }}{{- end }}

{{/* DNS names the webhook's serving certificate must cover. */}}
{{- define "gpuslice.webhookDnsNames" -}}
{{- $svc := include "gpuslice.webhookName" . }}
{{- $ns := .Release.Namespace }}
{{- toJson (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) }}
{{- end }}

{{/* imagePullSecrets of every pod of the chart: [{name: x}] as in a pod spec, plain names accepted. */}}
{{- define "gpuslice.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
{{- if kindIs "string" . }}
  - name: {{ . | quote }}
{{- else }}
  - name: {{ required "every imagePullSecrets entry needs a name" .name | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Where the webhook's TLS comes from: generated, certManager or secret. `auto` becomes certManager when
the cluster serves cert-manager.io/v1 (helm and Argo CD both pass the cluster's API versions to the
render), so GitOps renders without `lookup` do not make a new CA each time where cert-manager exists.
certManager asked for where the cluster does not serve cert-manager.io/v1 is refused with what to do,
not left to fail at apply time on "no matches for kind Issuer"; `helm template` knows no cluster, so
it passes --api-versions cert-manager.io/v1, or certManager.skipApiCheck skips the check.
*/}}
{{- define "gpuslice.tlsSource" -}}
{{- $source := .Values.webhook.tls.source }}
{{- $hasCertManager := .Capabilities.APIVersions.Has "cert-manager.io/v1" }}
{{- if eq $source "auto" }}
{{- $source = ternary "certManager" "generated" $hasCertManager }}
{{- else if and (eq $source "certManager") (not $hasCertManager) (not .Values.certManager.skipApiCheck) }}
{{- fail "webhook.tls.source is certManager, but the cluster serves no cert-manager.io/v1 API (cert-manager is not installed): install cert-manager first (https://cert-manager.io/docs/installation/), or set webhook.tls.source=generated (the chart makes the certificate) or webhook.tls.source=secret (your own kubernetes.io/tls Secret). Rendering without a cluster (helm template) for one that has cert-manager: pass --api-versions cert-manager.io/v1, or set certManager.skipApiCheck=true" }}
{{- end }}
{{- $source }}
{{- end }}

{{/*
Values that were renamed or removed: refuse them with what to set instead, rather than ignore them.
Included by configmap.yaml, which every render has.
*/}}
{{- define "gpuslice.checkRemovedValues" -}}
{{- $removed := list
  (list .Values.certManager "enabled" "certManager.enabled" "set webhook.tls.source: certManager (or auto, the default, which uses cert-manager where it is installed)")
  (list .Values.webhook "runAsUser" "webhook.runAsUser" "set webhook.podSecurityContext.runAsUser (and runAsGroup, fsGroup)")
  (list .Values.devicePlugin "requireOptInLabel" "devicePlugin.requireOptInLabel" "set devicePlugin.nodeSelection: optInLabel (true) or none (false)")
  (list .Values.devicePlugin "cdiSpecDir" "devicePlugin.cdiSpecDir" "set dra.cdiSpecDir: only the DRA plugin writes CDI specs; the device plugin no longer mounts the directory") }}
{{- range $removed }}
{{- if hasKey (index . 0) (index . 1) }}
{{- fail (printf "%s was removed: %s" (index . 2) (index . 3)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
nodeSelector and affinity of the pods that run on the plugin's nodes (the plugin and the MPS control
daemon), from devicePlugin.nodeSelection: optInLabel, gpuFeatureLabels (GPU Feature Discovery or Node
Feature Discovery labels, as NVIDIA's chart selects GPU nodes) or none.
*/}}
{{- define "gpuslice.devicePluginPlacement" -}}
{{- $dp := .Values.devicePlugin }}
{{- $selector := deepCopy $dp.nodeSelector }}
{{- $affinity := deepCopy $dp.affinity }}
{{- if eq $dp.nodeSelection "optInLabel" }}
{{- $_ := set $selector (printf "%s/enabled" (include "gpuslice.prefix" .)) "true" }}
{{- else if eq $dp.nodeSelection "gpuFeatureLabels" }}
{{- $nodeAffinity := default dict $affinity.nodeAffinity }}
{{- if $nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution }}
{{- fail "devicePlugin.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution cannot be combined with devicePlugin.nodeSelection gpuFeatureLabels (which sets it): put required labels in devicePlugin.nodeSelector, or set nodeSelection: none" }}
{{- end }}
{{- /* Node selector terms are ORed: a node that either labeller marks as having an NVIDIA GPU; with
mode both, not one given to the DRA plugin (<prefix>/dra=true), or both halves would offer its GPUs. */}}
{{- $gpuTerms := list }}
{{- range list "nvidia.com/gpu.present" "feature.node.kubernetes.io/pci-10de.present" }}
{{- $expressions := list (dict "key" . "operator" "In" "values" (list "true")) }}
{{- if eq $.Values.mode "both" }}
{{- $expressions = append $expressions (dict "key" (printf "%s/dra" (include "gpuslice.prefix" $)) "operator" "NotIn" "values" (list "true")) }}
{{- end }}
{{- $gpuTerms = append $gpuTerms (dict "matchExpressions" $expressions) }}
{{- end }}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $gpuTerms) }}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity }}
{{- end }}
{{- with $selector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Where the API server sends admissions: the in-cluster Service, or webhook.externalURL. */}}
{{- define "gpuslice.webhookClientTarget" -}}
{{- with .Values.webhook.externalURL -}}
url: {{ printf "%s/mutate" (trimSuffix "/" .) | quote }}
{{- else -}}
service:
  name: {{ include "gpuslice.webhookName" . }}
  namespace: {{ .Release.Namespace }}
  path: /mutate
  port: 443
{{- end }}
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

{{/* --- DRA mode (docs/dra.md) --------------------------------------------------------------- */}}

{{- define "gpuslice.draPluginName" -}}{{ include "gpuslice.componentName" (dict "root" . "component" "dra-plugin") }}{{- end }}

{{/* "true" when the chart runs the device plugin DaemonSet (mode devicePlugin or both). */}}
{{- define "gpuslice.devicePluginMode" -}}
{{- if and .Values.devicePlugin.enabled (has .Values.mode (list "devicePlugin" "both")) }}true{{ end }}
{{- end }}

{{/* "true" when the chart runs DRA mode (mode dra or both), after checking the cluster can run it:
resource.k8s.io/v1 with consumable capacity (KEP-5075) is on by default from 1.36; on 1.34 and 1.35 it
needs the alpha DRAConsumableCapacity gate everywhere; before 1.34 it does not exist. */}}
{{- define "gpuslice.draMode" -}}
{{- if has .Values.mode (list "dra" "both") }}
{{- $version := .Capabilities.KubeVersion.Version }}
{{- if semverCompare "<1.34.0-0" $version }}
{{- fail (printf "mode %q needs Kubernetes 1.34 or later (resource.k8s.io/v1 and consumable capacity); this cluster is %s: use mode devicePlugin" .Values.mode $version) }}
{{- else if and (semverCompare "<1.36.0-0" $version) (not .Values.dra.consumableCapacityGateEnabled) }}
{{- fail (printf "mode %q on Kubernetes %s needs the alpha feature gate DRAConsumableCapacity on kube-apiserver, kube-scheduler, kube-controller-manager and every kubelet (on by default from 1.36); enable it and set dra.consumableCapacityGateEnabled=true, or use mode devicePlugin" .Values.mode $version) }}
{{- end }}
{{- true }}
{{- end }}
{{- end }}

{{/* "true" when the controller requeues (controller/requeue.py: config.requeue.enabled, and the webhook
not making ResourceClaims, where kubelet refuses no burst): only then may it create and delete pods. */}}
{{- define "gpuslice.requeues" -}}
{{- if and .Values.config.requeue.enabled (not (or (eq .Values.mode "dra") .Values.config.dra.enabled)) }}true{{ end }}
{{- end }}

{{/* "true" when the chart runs the controller (controller/): it requeues, or it paces, or both. */}}
{{- define "gpuslice.controller" -}}
{{- if or (include "gpuslice.requeues" .) (include "gpuslice.pacer" .) }}true{{ end }}
{{- end }}

{{/* "true" when the webhook turns annotations into ResourceClaims (and may create their templates). */}}
{{- define "gpuslice.draClaims" -}}
{{- if and (include "gpuslice.draMode" .) (or (eq .Values.mode "dra") .Values.config.dra.enabled) }}true{{ end }}
{{- end }}

{{/* --- Pacing (docs/steering.md, "Pacing") ----------------------------------------------------- */}}

{{/* "true" when the controller paces: config.pacing.enabled with the webhook converting to extended
resources. Pacing in DRA mode is refused rather than ignored: the webhook gates only the pods it converts
to extended resources, and the DRA scheduler allocates from ResourceSlices, not from node labels that lag,
so kubelet refuses nothing a pacer could prevent. */}}
{{- define "gpuslice.pacer" -}}
{{- if .Values.config.pacing.enabled }}
{{- if or (eq .Values.mode "dra") .Values.config.dra.enabled }}
{{- fail (printf "config.pacing.enabled needs the webhook in device-plugin mode, but it makes ResourceClaims here (%s): the scheduler then allocates from ResourceSlices, never by node labels that lag, so there is nothing to pace; set config.pacing.enabled=false" (ternary "mode dra" "config.dra.enabled" (eq .Values.mode "dra"))) }}
{{- end }}
{{- true }}
{{- end }}
{{- end }}
