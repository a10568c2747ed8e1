{{/* The release's name for everything it creates, at most 63 characters. */}}
{{- define "clipjob.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "clipjob.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: clipjob
{{- end -}}

{{/* Selector labels of one component (webhook, relay). */}}
{{- define "clipjob.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "clipjob.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "clipjob.webhookName" -}}{{ include "clipjob.fullname" . }}-webhook{{- end -}}
{{- define "clipjob.relayName" -}}{{ include "clipjob.fullname" . }}-relay{{- end -}}
{{- define "clipjob.webhookTLSSecret" -}}{{ include "clipjob.fullname" . }}-webhook-tls{{- end -}}
{{- define "clipjob.relayTLSSecret" -}}{{ include "clipjob.fullname" . }}-relay-tls{{- end -}}
{{- define "clipjob.caSecret" -}}{{ include "clipjob.fullname" . }}-ca{{- end -}}
{{- define "clipjob.configMap" -}}{{ include "clipjob.fullname" . }}-config{{- end -}}

{{/* Where the API server reaches a webhook path: the Service, or for development webhook.url. */}}
{{- define "clipjob.clientConfig" -}}
{{- if .root.Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" .root.Values.webhook.url) .path | quote }}
{{- else }}
service:
  name: {{ include "clipjob.webhookName" .root }}
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path | quote }}
  port: 443
{{- end }}
{{- if eq .root.Values.certificates.mode "external" }}
caBundle: {{ required "certificates.mode external needs certificates.caBundle" .root.Values.certificates.caBundle }}
{{- end }}
{{- end -}}

{{/* Namespaces the webhooks never see: the release's own and webhook.excludeNamespaces. */}}
{{- define "clipjob.namespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- range (concat (list .Release.Namespace) .Values.webhook.excludeNamespaces | uniq) }}
        - {{ . | quote }}
        {{- end }}
    {{- with .Values.webhook.namespaces }}
    - key: kubernetes.io/metadata.name
      operator: In
      values:
        {{- range (. | uniq) }}
        - {{ . | quote }}
        {{- end }}
    {{- end }}
{{- end -}}

{{/* CEL: the labels map at path has a paperclip.io/ key (has() guards a map the object may not have). */}}
{{- define "clipjob.paperclipLabel" -}}
(has({{ . }}) && {{ . }}.exists(k, k.startsWith('paperclip.io/')))
{{- end -}}

{{/* CEL: spec.field differs between the object and the stored one, an absent field counting as its default. */}}
{{- define "clipjob.changed" -}}
{{- $f := index . 0 -}}{{- $d := index . 1 -}}
{{ " || " }}(has(object.spec.{{ $f }}) ? object.spec.{{ $f }} : {{ $d }}) != (has(oldObject.spec.{{ $f }}) ? oldObject.spec.{{ $f }} : {{ $d }})
{{- end -}}

{{/* The concurrency mode of the config the chart renders (config.policy.concurrency.mode), Reject when unset. */}}
{{- define "clipjob.concurrencyMode" -}}
{{- ((.Values.config.policy | default dict).concurrency | default dict).mode | default "Reject" -}}
{{- end -}}

{{/* CEL: a CREATE of a queued run as clipjob completes one: an agent Job (labeled on itself), suspended, marked queued, with its template hash and containers. */}}
{{- define "clipjob.queuedRunCreate" -}}
{{- $o := . -}}
request.operation == 'CREATE' && has({{ $o }}.metadata.labels) && 'paperclip.io/agent-id' in {{ $o }}.metadata.labels && has({{ $o }}.spec.suspend) && {{ $o }}.spec.suspend == true && has({{ $o }}.metadata.annotations) && 'clipjob.paperclip.io/queued' in {{ $o }}.metadata.annotations && {{ $o }}.metadata.annotations['clipjob.paperclip.io/queued'] == 'true' && 'clipjob.paperclip.io/template-hash' in {{ $o }}.metadata.annotations && has({{ $o }}.spec.template.spec.containers) && size({{ $o }}.spec.template.spec.containers) > 0
{{- end -}}

{{/* An UPDATE that adds, removes or rewrites the Job's created-by annotation (clipjob keeps it immutable). */}}
{{- define "clipjob.createdByChanged" -}}
{{- $k := "'clipjob.paperclip.io/created-by'" -}}
{{- $new := printf "(has(object.metadata.annotations) && %s in object.metadata.annotations)" $k -}}
{{- $old := printf "(has(oldObject.metadata.annotations) && %s in oldObject.metadata.annotations)" $k -}}
{{ " || " }}{{ $new }} != {{ $old }} || ({{ $new }} && {{ $old }} && object.metadata.annotations[{{ $k }}] != oldObject.metadata.annotations[{{ $k }}])
{{- end -}}

{{- define "clipjob.caInjection" -}}
{{- if eq .Values.certificates.mode "certManager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "clipjob.webhookName" . }}
{{- end }}
{{- end -}}

{{- define "clipjob.podSecurityContext" -}}
runAsNonRoot: true
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "clipjob.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The namespaces agents run in, as a JSON list: agentNamespaces (else the source namespace), and the tenant namespaces of the config, so the webhook gets its Role in each with no hand-made one. A tenant glob cannot be given a Role: the chart refuses it, naming the fix. Claims of scope Cluster live in one of them. */}}
{{- define "clipjob.agentNamespaces" -}}
{{- $nss := .Values.agentNamespaces | default (list .Values.config.source.namespace) -}}
{{- range (.Values.config.tenantNamespaces | default list) -}}
{{- if regexMatch "[*?\\[]" . -}}
{{- fail (printf "config.tenantNamespaces: %q is a glob, and the chart can give the webhook a Role only in namespaces it can name; list each tenant namespace (the webhook reads run Secrets' metadata and writes claims there)" .) -}}
{{- end -}}
{{- if not (has . $nss) -}}
{{- $nss = append $nss . -}}
{{- end -}}
{{- end -}}
{{- if has .Release.Namespace $nss -}}
{{- fail (printf "agentNamespaces: the release namespace %s may not be an agent namespace (the webhooks never see the release namespace, so agents there would run unchecked); install clipjob in a namespace of its own" .Release.Namespace) -}}
{{- end -}}
{{- toJson $nss -}}
{{- end -}}

{{/* CEL: an UPDATE of a pod changes a container's or an init container's image (the one field of its containers an update may change; kubelet restarts the container as the new image). */}}
{{- define "clipjob.podImagesChanged" -}}
(request.operation == 'UPDATE' && !has(request.subResource) && (object.spec.containers.map(c, c.image) != oldObject.spec.containers.map(c, c.image) || has(object.spec.initContainers) != has(oldObject.spec.initContainers) || (has(object.spec.initContainers) && object.spec.initContainers.map(c, c.image) != oldObject.spec.initContainers.map(c, c.image))))
{{- end -}}

{{/* The namespaces whose pods the shared-claim rule judges, as a CEL list ('a', 'b'): the agent namespaces that are not tenants'; empty when there are none or config.policy.sharedClaim.mode is Disabled. */}}
{{- define "clipjob.sharedClaimNamespaces" -}}
{{- $shared := list -}}
{{- range (.Values.agentNamespaces | default (list .Values.config.source.namespace)) -}}
{{- if not (has . ($.Values.config.tenantNamespaces | default list)) -}}{{- $shared = append $shared (printf "'%s'" .) -}}{{- end -}}
{{- end -}}
{{- if and $shared (ne ((.Values.config.policy | default dict).sharedClaim | default dict).mode "Disabled") -}}
[{{ join ", " $shared }}]
{{- end -}}
{{- end -}}
