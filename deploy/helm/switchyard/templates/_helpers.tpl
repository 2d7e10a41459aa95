{{/* Names and labels. */}}
{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "switchyard.fullname" -}}
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

{{- define "switchyard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
switchyard.overlay: the keys of a list of dicts, a later dict's winning,
as JSON; a null value or a missing dict sets nothing. Unlike merge, a
value of 0, false or "" counts as set.
*/}}
{{- define "switchyard.overlay" -}}
{{- $out := dict -}}
{{- range $d := . -}}
{{- if kindIs "map" $d -}}
{{- range $k, $v := $d -}}
{{- if not (kindIs "invalid" $v) -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
switchyard.image renders an image reference from a component's image
values and the chart's shared ones: (dict "values" .Values "image" .Values.broker.image).
*/}}
{{- define "switchyard.image" -}}
{{- $v := .values -}}
{{- $tag := required "image.tag is required" (.image.tag | default $v.image.tag) -}}
{{- if $v.image.registry -}}
{{- printf "%s/%s:%s" $v.image.registry .image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
switchyard.agent.timing: the seconds of an agent pod's shutdown, as YAML:
drain (the agent's --drain-timeout), engineStopDelay (the engine's preStop
sleep: it keeps serving while its agent drains) and grace (the pod's
terminationGracePeriodSeconds). A pool may set drainSeconds,
engineStopDelaySeconds and terminationGracePeriodSeconds of its own.
Argument: (dict "values" <switchyard values> "pool" <pool>).
*/}}
{{- define "switchyard.agent.timing" -}}
{{- $a := .values.agent -}}
{{- $p := .pool -}}
{{- /* A key that is set, even to 0, wins; only a missing or null one falls through. */ -}}
{{- $drain := 25 -}}
{{- if not (kindIs "invalid" $a.drainSeconds) }}{{ $drain = int $a.drainSeconds }}{{ end -}}
{{- if not (kindIs "invalid" $p.drainSeconds) }}{{ $drain = int $p.drainSeconds }}{{ end -}}
{{- $stop := add $drain 5 -}}
{{- if not (kindIs "invalid" $a.engineStopDelaySeconds) }}{{ $stop = int $a.engineStopDelaySeconds }}{{ end -}}
{{- if not (kindIs "invalid" $p.engineStopDelaySeconds) }}{{ $stop = int $p.engineStopDelaySeconds }}{{ end -}}
{{- $grace := add $stop 30 -}}
{{- if not (kindIs "invalid" $a.terminationGracePeriodSeconds) }}{{ $grace = int $a.terminationGracePeriodSeconds }}{{ end -}}
{{- if not (kindIs "invalid" $p.terminationGracePeriodSeconds) }}{{ $grace = int $p.terminationGracePeriodSeconds }}{{ end -}}
{{- if lt $drain 1 -}}
{{- fail (printf "pool %s: drainSeconds (%d) must be at least 1: an agent without a drain timeout may outlive the grace period" $p.name $drain) -}}
{{- end -}}
{{- if le $stop $drain -}}
{{- fail (printf "pool %s: engineStopDelaySeconds (%d) must exceed the agent's drainSeconds (%d): the engine must serve until its agent has drained" $p.name $stop $drain) -}}
{{- end -}}
{{- if le $grace $stop -}}
{{- fail (printf "pool %s: terminationGracePeriodSeconds (%d) must exceed engineStopDelaySeconds (%d)" $p.name $grace $stop) -}}
{{- end -}}
drain: {{ $drain }}
engineStopDelay: {{ $stop }}
grace: {{ $grace }}
{{- end -}}

{{/*
switchyard.goEnv renders the Go runtime's environment of a Switchyard
container: GOGC, and GOMEMLIMIT at goRuntime.memoryLimitPercent of the
container's memory limit, read through the downward API. The API gives
the limit divided by a divisor, rounded up: a divisor of 1 MiB scaled by
100/percent gives the share in MiB, which GOMEMLIMIT takes with its unit.
Argument: (dict "values" <this chart's values> "container" <container name>).
*/}}
{{- define "switchyard.goEnv" -}}
{{- $g := .values.goRuntime -}}
{{- if not (kindIs "invalid" $g.gogc) }}
- name: GOGC
  value: {{ $g.gogc | quote }}
{{- end }}
{{- if $g.memoryLimitPercent }}
{{- $pct := int $g.memoryLimitPercent -}}
{{- if or (lt $pct 1) (gt $pct 100) -}}
{{- fail (printf "goRuntime.memoryLimitPercent (%d): want 1 to 100" $pct) -}}
{{- end }}
# GOMEMLIMIT_MIB: the memory limit x {{ $pct }}% in MiB.
- name: GOMEMLIMIT_MIB
  valueFrom:
    resourceFieldRef:
      containerName: {{ .container }}
      resource: limits.memory
      divisor: {{ div (mul 1048576 100) $pct | quote }}
- name: GOMEMLIMIT
  value: $(GOMEMLIMIT_MIB)MiB
{{- end }}
{{- end -}}

{{/*
switchyard.agent.container renders the worker-agent sidecar container, to
add to the containers of an engine's pod. It reaches the engine on
127.0.0.1:<enginePort>, reads its NATS password from the credentials
Secret, drains on SIGTERM within drainSeconds, and is ready (/readyz) only
while it takes jobs.

Argument: (dict "values" <this chart's values> "pool" <pool>), where pool
has: model, role, engine, enginePort, slots, and optionally pdLabels,
bootstrapPort, natsUser, drainSeconds, agentArgs, agentVolumeMounts. From a parent chart that
depends on this one, pass .Values.switchyard as values.
*/}}
{{- define "switchyard.agent.container" -}}
{{- $v := .values -}}
{{- $p := .pool -}}
{{- $a := $v.agent -}}
{{- $t := include "switchyard.agent.timing" . | fromYaml -}}
{{- $role := $p.role | default "regular" -}}
{{- if not (has $role (list "regular" "prefill" "decode")) -}}
{{- fail (printf "pool %s: role %q: want regular, prefill or decode" $p.name $role) -}}
{{- end -}}
{{- $engine := $p.engine | default "openai" -}}
{{- $port := required (printf "pool %s: enginePort is required" $p.name) $p.enginePort -}}
{{- $engineURL := printf "http://127.0.0.1:%v" $port -}}
{{- if eq $engine "vllm-grpc" -}}
{{- $engineURL = printf "127.0.0.1:%v" $port -}}
{{- end -}}
{{- $user := $p.natsUser | default (printf "agent-%s" $role) -}}
{{- $slots := 8 -}}
{{- if not (kindIs "invalid" $p.slots) }}{{ $slots = int $p.slots }}{{ end -}}
{{- if lt $slots 1 -}}
{{- fail (printf "pool %s: slots (%d) must be at least 1" $p.name $slots) -}}
{{- end -}}
- name: switchyard-agent
  image: {{ include "switchyard.image" (dict "values" $v "image" $a.image) | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    - --nats-url
    - {{ required "nats.url is required" $v.nats.url | quote }}
    - --nats-user
    - {{ $user | quote }}
    - --engine
    - {{ $engine | quote }}
    - --engine-url
    - {{ $engineURL | quote }}
    - --model
    - {{ required (printf "pool %s: model is required" $p.name) $p.model | quote }}
    - --role
    - {{ $role | quote }}
    - --slots
    - {{ $slots | quote }}
    - --drain-timeout
    - {{ printf "%ds" (int $t.drain) | quote }}
    - --metrics-listen
    - {{ printf "0.0.0.0:%v" $a.metricsPort | quote }}
    - --log-format
    - {{ $a.logFormat | default "json" | quote }}
    {{- with $p.pdLabels }}
    - --pd-labels
    - {{ . | quote }}
    {{- end }}
    {{- if and (eq $role "prefill") (eq $engine "sglang") }}
    - --bootstrap-host
    - "$(POD_IP)"
    - --bootstrap-port
    - {{ required (printf "pool %s: an SGLang prefill pool needs bootstrapPort (the engine's --disaggregation-bootstrap-port)" $p.name) $p.bootstrapPort | quote }}
    {{- end }}
    {{- range $p.agentArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: SWITCHYARD_ID
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: SWITCHYARD_NATS_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ required "nats.credentialsSecret is required" $v.nats.credentialsSecret | quote }}
          key: {{ $user | quote }}
    {{- include "switchyard.goEnv" (dict "values" $v "container" "switchyard-agent") | trim | nindent 4 }}
  ports:
    - name: agent-metrics
      containerPort: {{ $a.metricsPort }}
      protocol: TCP
  readinessProbe:
    httpGet:
      path: /readyz
      port: agent-metrics
    periodSeconds: 5
    failureThreshold: 2
  {{- with $a.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $a.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $mounts := concat ($a.volumeMounts | default list) ($p.agentVolumeMounts | default list) }}
  {{- with $mounts }}
  volumeMounts:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/*
switchyard.engine.preStop renders the lifecycle of an engine container
whose agent drains on SIGTERM: the engine keeps serving for
engineStopDelaySeconds before it is sent its own SIGTERM.
Argument: as for switchyard.agent.container.
*/}}
{{- define "switchyard.engine.lifecycle" -}}
{{- $t := include "switchyard.agent.timing" . | fromYaml -}}
preStop:
  sleep:
    seconds: {{ $t.engineStopDelay }}
{{- end -}}

{{/*
switchyard.pod.grace renders the terminationGracePeriodSeconds of an
engine pod with the agent. Argument: as for switchyard.agent.container.
*/}}
{{- define "switchyard.pod.grace" -}}
{{- $t := include "switchyard.agent.timing" . | fromYaml -}}
{{- $t.grace -}}
{{- end -}}
