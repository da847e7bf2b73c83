{{/* The release's name, with the chart's unless it holds it already. */}}
{{- define "promoflow.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of a component: (dict "root" $ "component" name). */}}
{{- define "promoflow.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "promoflow.labels" -}}
{{ include "promoflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "promoflow.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Where the Secrets of files are mounted. */}}
{{- define "promoflow.postgresDir" -}}/run/secrets/postgres{{- end -}}
{{- define "promoflow.kafkaTLSDir" -}}/run/secrets/kafka-tls{{- end -}}
{{- define "promoflow.kafkaSASLDir" -}}/run/secrets/kafka-sasl{{- end -}}

{{/*
The settings of a command: (dict "root" $ "database" bool "kafka" bool).
Every command reaches Kafka the same way (kafka false: one that takes none,
promoflow migrate); the database is for those that take one.
*/}}
{{- define "promoflow.env" -}}
{{- $v := .root.Values -}}
{{- if .database }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ $v.database.secretName | quote }}, key: {{ $v.database.urlKey | quote }}}
{{- with $v.database.directUrlKey }}
- name: DATABASE_DIRECT_URL
  valueFrom:
    secretKeyRef: {name: {{ $v.database.secretName | quote }}, key: {{ . | quote }}}
{{- end }}
{{- end }}
{{- if or (not (hasKey . "kafka")) .kafka }}
- name: KAFKA_BROKERS
  value: {{ $v.kafka.brokers | quote }}
{{- with $v.kafka.tls }}
{{- if .enabled }}
- name: KAFKA_TLS
  value: "true"
{{- if .secret }}
{{- with .caKey }}
- name: KAFKA_TLS_CA_FILE
  value: {{ printf "%s/%s" (include "promoflow.kafkaTLSDir" $) . | quote }}
{{- end }}
{{- with .certKey }}
- name: KAFKA_TLS_CERT_FILE
  value: {{ printf "%s/%s" (include "promoflow.kafkaTLSDir" $) . | quote }}
{{- end }}
{{- with .keyKey }}
- name: KAFKA_TLS_KEY_FILE
  value: {{ printf "%s/%s" (include "promoflow.kafkaTLSDir" $) . | quote }}
{{- end }}
{{- end }}
{{- with .serverName }}
- name: KAFKA_TLS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- with $v.kafka.sasl }}
{{- if .mechanism }}
- name: KAFKA_SASL_MECHANISM
  value: {{ .mechanism | quote }}
- name: KAFKA_SASL_USERNAME
  value: {{ .username | quote }}
- name: KAFKA_SASL_PASSWORD_FILE
  value: {{ printf "%s/%s" (include "promoflow.kafkaSASLDir" $) .passwordKey | quote }}
{{- end }}
{{- end }}
{{- end }}
- name: LOG_LEVEL
  value: {{ $v.logLevel | quote }}
{{- end -}}

{{/* The mounts of the Secrets of files, and their volumes. */}}
{{- define "promoflow.volumeMounts" -}}
{{- with .Values.database.filesSecret }}
- {name: postgres-files, mountPath: {{ include "promoflow.postgresDir" $ }}, readOnly: true}
{{- end }}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.secret }}
- {name: kafka-tls, mountPath: {{ include "promoflow.kafkaTLSDir" $ }}, readOnly: true}
{{- end }}
{{- if .Values.kafka.sasl.mechanism }}
- {name: kafka-sasl, mountPath: {{ include "promoflow.kafkaSASLDir" $ }}, readOnly: true}
{{- end }}
{{- end -}}

{{/*
Mode 0440 with fsGroup: lib/pq accepts a client key owned by root that its
group may read (0640 at most), and the process (uid 65532) reads it as a
member of the group.
*/}}
{{- define "promoflow.volumes" -}}
{{- with .Values.database.filesSecret }}
- name: postgres-files
  secret: {secretName: {{ . | quote }}, defaultMode: 0440}
{{- end }}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.secret }}
- name: kafka-tls
  secret: {secretName: {{ .Values.kafka.tls.secret | quote }}, defaultMode: 0440}
{{- end }}
{{- if .Values.kafka.sasl.mechanism }}
- name: kafka-sasl
  secret:
    secretName: {{ required "kafka.sasl.passwordSecret is required with a SASL mechanism" .Values.kafka.sasl.passwordSecret | quote }}
    defaultMode: 0440
    items: [{key: {{ .Values.kafka.sasl.passwordKey | quote }}, path: {{ .Values.kafka.sasl.passwordKey | quote }}}]
{{- end }}
{{- end -}}

{{/* The pod's placement, shared by the processes and the Jobs. */}}
{{- define "promoflow.placement" -}}
{{- with .Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The egress rules of every pod: DNS, PostgreSQL, Kafka (the ports of
kafka.brokers unless networkPolicy.egress.kafka.ports names them), the OTLP
collector, then networkPolicy.egress.extra. A peer list left empty is any
address.
*/}}
{{- define "promoflow.egress" -}}
{{- $e := .Values.networkPolicy.egress -}}
{{- $kafkaPorts := $e.kafka.ports -}}
{{- if not $kafkaPorts -}}
{{- $seen := dict -}}
{{- range splitList "," .Values.kafka.brokers -}}
{{- $port := trim . | splitList ":" | last -}}
{{- if not (hasKey $seen $port) -}}
{{- $_ := set $seen $port true -}}
{{- $kafkaPorts = append $kafkaPorts (atoi $port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
- ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]
  {{- with $e.dns.to }}
  to: {{- toYaml . | nindent 4 }}
  {{- end }}
{{- range $dest := list (dict "to" $e.postgres.to "ports" $e.postgres.ports) (dict "to" $e.kafka.to "ports" $kafkaPorts) (dict "to" $e.otlp.to "ports" $e.otlp.ports) }}
- ports:
  {{- range $dest.ports }}
    - {port: {{ . }}, protocol: TCP}
  {{- end }}
  {{- with $dest.to }}
  to: {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- with $e.extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}
