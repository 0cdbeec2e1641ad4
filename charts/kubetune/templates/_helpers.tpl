{{/* Names and labels shared by every template. */}}

{{- define "kubetune.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubetune.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "kubetune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubetune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kubetune.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kubetune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kubetune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubetune.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kubetune.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The only API calls the operator makes (verified by tests/integration/test_chart.py,
which runs a whole Experiment with exactly these permissions):
- kopf watches Experiments (list, watch) and patches them (finalizer, its annotations);
  with settings.scanning.disabled it reads no CRDs and no Namespaces, and standalone
  it needs no peering resources;
- the controller writes Experiment status, creates Trials (get: an earlier attempt
  created it already), lists them to resume after a restart, writes their status,
  and deletes a same-named Trial an earlier Experiment left behind (deleted with
  --cascade=orphan: nothing else ever removes it, k8s/store.py);
- Events on Experiments (core/v1 Events, create);
- with podExecutor.enabled, kubetune.podExecutorRules below.
experiments/finalizers update: the API server's OwnerReferencesPermissionEnforcement
admission plugin (enabled on e.g. OpenShift) requires it for Trials whose
ownerReference has blockOwnerDeletion.
*/}}
{{- define "kubetune.rules" -}}
- apiGroups: [kubetune.dev]
  resources: [experiments]
  verbs: [list, watch, patch]
- apiGroups: [kubetune.dev]
  resources: [experiments/status]
  verbs: [patch]
- apiGroups: [kubetune.dev]
  resources: [experiments/finalizers]
  verbs: [update]
- apiGroups: [kubetune.dev]
  resources: [trials]
  verbs: [get, list, create, delete, patch]   # patch: a finished Trial's managedFields stripped
- apiGroups: [kubetune.dev]
  resources: [trials/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.podExecutor.enabled }}
{{ include "kubetune.podExecutorRules" . }}
{{- end }}
{{- end }}

{{/*
podExecutor.enabled (spec.executor: pod), the calls of executors/pods.py and the
ingest endpoint (verified by tests/integration/test_chart_pods.py):
- per attempt a Pod: created, listed by label each poll, deleted on stop/pause/retry;
- per trial a Secret (the token: created, read back after a restart and by the ingest
  endpoint) and a ConfigMap (the params: created, read, patched when a PBT exploit
  changes them); Kubernetes' garbage collector deletes both with their Trial;
- pods/log: the log tail of a failed pod, and the results of `metricsCollector: stdout` trials;
- Events listed for the cluster autoscaler's word on pending pods;
- trials/finalizers update: the Pods, Secrets and ConfigMaps name their Trial as
  owner with blockOwnerDeletion (OwnerReferencesPermissionEnforcement);
- with podSecurity.namespaceOptIn, namespaces get: the opt-in labels of the served
  namespace (in a Role, that one Namespace object only).
Secrets: get and create, never list, watch, update or delete, and only where
Experiments are served (watchNamespaces: Roles, no ClusterRole).  RBAC cannot narrow
them further: resourceNames cannot restrict create, and each trial's Secret has a
new name.  The operator reads only Secrets named <trial>-token that its Trial owns
(it checks the ownerReference); deletion is Kubernetes' garbage collector's.
*/}}
{{- define "kubetune.podExecutorRules" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [list, create, delete]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [list]
- apiGroups: [kubetune.dev]
  resources: [trials/finalizers]
  verbs: [update]
{{- if .Values.podExecutor.podSecurity.namespaceOptIn }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
{{- end }}
{{- if .Values.podExecutor.kueue.enabled }}
{{- /* Kueue (spec.queue, k8s/kueue.py): read-only.  Workloads say whether a gated trial
     pod has quota and is waiting for an admission check (Provisioning); its LocalQueue
     how many workloads wait there.  Kueue's own events on a pod (why it was evicted) are
     read with the events list above. */}}
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads, localqueues]
  verbs: [get, list, watch]
{{- end }}
{{- end }}

{{/* The dashboard's Pods: a name of their own, so the operator's selector (its
Deployment, its Services, its replicas' podAffinity) never matches them. */}}
{{- define "kubetune.dashboardName" -}}
{{- printf "%s-dashboard" (include "kubetune.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubetune.dashboardLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kubetune.dashboardSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: dashboard
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kubetune.dashboardSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kubetune.name" . }}-dashboard
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
