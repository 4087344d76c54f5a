{{/* Names and labels shared by every template. */}}

{{- define "kraftkeeper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release name + chart name, unless the release name already contains it. */}}
{{- define "kraftkeeper.fullname" -}}
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

{{- define "kraftkeeper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kraftkeeper.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kraftkeeper.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kraftkeeper.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kraftkeeper
{{- end }}

{{- define "kraftkeeper.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kraftkeeper.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kraftkeeper.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The namespaces the operator watches, comma-separated: operator.watchNamespaces, else the release
namespace with rbac.scope namespace; empty means every namespace (rbac.scope cluster only).
*/}}
{{- define "kraftkeeper.watched" -}}
{{- if .Values.operator.watchNamespaces }}
{{- join "," .Values.operator.watchNamespaces }}
{{- else if ne .Values.rbac.scope "cluster" }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/*
The operator's permissions (least privilege, see docs/operator.md). Used by one Role per watched
namespace (rbac.scope namespace) or by the ClusterRole (rbac.scope cluster).
*/}}
{{- define "kraftkeeper.rules" -}}
# The custom resources: watched, annotated by kopf (progress), finalizers, status.
- apiGroups: [kraftkeeper.io]
  resources: [kraftquorums]
  verbs: [get, list, watch, patch, update]
- apiGroups: [kraftkeeper.io]
  resources: [kraftquorums/status]
  verbs: [get, patch, update]
- apiGroups: [kraftkeeper.io]
  resources: [kraftquorums/finalizers]
  verbs: [update]
# The quorum's StatefulSet, headless Service and PodDisruptionBudget are owned by the operator.
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, update, patch, delete]
# The <name>-bootstrap ConfigMap: once the quorum has bootstrapped, fresh volumes are formatted
# as replacement disks (--no-initial-controllers).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update, patch, delete]
# Pods are read (health, identity) and deleted to restart a replica on a new volume.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, delete]
# Claims are read to detect a replaced volume, and deleted on scale-down / disk replacement.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, delete]
# Kubernetes Events about recoveries (kopf posts them too).
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# TLS (spec.tls): the quorum's Secrets (NAME-ca, NAME-tls, NAME-client; and cert-manager's
# NAME-operator-tls, read only) are read by name: no list or watch, so the operator cannot
# enumerate the namespace's other Secrets.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, update, patch, delete]
# The quorum's NetworkPolicy (peers, the operator, spec.clientSelector).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, update, patch, delete]
# cert-manager Certificates when spec.tls.certManager names an issuer (no CA key is ever read).
- apiGroups: [cert-manager.io]
  resources: [certificates]
  verbs: [get, create, update, patch, delete]
{{- end }}
