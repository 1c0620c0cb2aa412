{{/*
Shared helpers. GPU amounts are handled the way spawner/core/units.py does it:
as integer milli-GPUs, never as floats, and quota units are rounded UP, so
the cluster never refuses a pod that gpulab's exact ledger admitted.
*/}}

{{- define "gpulab.labels" -}}
app.kubernetes.io/name: gpulab
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end }}

{{/*
The name of a cluster-scoped object of this release (PriorityClass, ClusterQueue,
ResourceFlavor, KAI Queue): "<release>-<suffix>", so that two releases (staging and
production) can share a cluster. Call with (list $ "suffix").
*/}}
{{- define "gpulab.clusterName" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" $root.Release.Name (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
gpulab's priority classes, highest first, as a YAML list of {class, value,
preemptionPolicy, description}: spawner/core/priority.py's table (the tests check it),
with the values priorityClasses.otherTenants chooses (priority.OTHER_TENANTS_VALUES).
*/}}
{{- define "gpulab.priorityClasses" -}}
{{- $choice := .Values.priorityClasses.otherTenants | default "preempt" -}}
{{- $bands := dict "preempt" (list 10000 50) "protect" (list 0 -50) -}}
{{- if not (hasKey $bands $choice) -}}
{{- fail (printf "gpulab: priorityClasses.otherTenants %q: choose preempt or protect" $choice) -}}
{{- end -}}
{{- $inQuota := index (get $bands $choice) 0 -}}
{{- $overQuota := index (get $bands $choice) 1 -}}
- {class: production, value: {{ $inQuota }}, preemptionPolicy: PreemptLowerPriority, description: "Inference endpoints, in quota. Never preempted; never admitted over quota."}
- {class: training, value: {{ $inQuota }}, preemptionPolicy: PreemptLowerPriority, description: "Training jobs, in quota. Never preempted; never admitted over quota."}
- {class: development, value: {{ $inQuota }}, preemptionPolicy: PreemptLowerPriority, description: "Notebooks within the team guarantee. Never preempted; above it they run as over-quota."}
- {class: batch, value: {{ $inQuota }}, preemptionPolicy: PreemptLowerPriority, description: "Sweeps and background jobs within the team guarantee; above it they run as over-quota."}
- {class: over-quota, value: {{ $overQuota }}, preemptionPolicy: Never, description: "Work running above its team's guarantee on borrowed capacity; preempted by any in-quota work."}
{{- end }}

{{/* "true" when the kai backend is the default or any profile's. */}}
{{- define "gpulab.kaiInUse" -}}
{{- $sharing := .Values.gpulab.sharing | default dict -}}
{{- $want := eq ($sharing.backend | default "whole") "kai" -}}
{{- range .Values.gpulab.profiles }}{{ if eq (.sharing | default "") "kai" }}{{ $want = true }}{{ end }}{{ end -}}
{{- $want -}}
{{- end }}

{{/*
The name template of the teams' KAI queues ({team} = the team's name):
gpulab.sharing.kai.queue when set, else "<release>-{team}". The chart writes it
into the catalog, so the hub labels pods with the queues this release creates.
*/}}
{{- define "gpulab.kaiQueueTemplate" -}}
{{- $kai := (.Values.gpulab.sharing | default dict).kai | default dict -}}
{{- $kai.queue | default (printf "%s-{team}" .Release.Name) -}}
{{- end }}

{{/* The parent of the teams' KAI queues: kai.parentQueue, else the release's name. */}}
{{- define "gpulab.kaiParentQueue" -}}
{{- .Values.kai.parentQueue | default .Release.Name -}}
{{- end }}

{{- define "gpulab.hubNamespace" -}}
{{- .Values.hub.serviceAccount.namespace | default .Release.Namespace -}}
{{- end }}

{{/* The namespace a team's pods run in. Call with (dict "team" $team "root" $). */}}
{{- define "gpulab.teamNamespace" -}}
{{- $v := .root.Values -}}
{{- if $v.teamNamespaces.enabled -}}
{{- .team.namespace | default (printf "%s%s" ($v.teamNamespaces.prefix | default (printf "%s-" .root.Release.Name)) .team.name) -}}
{{- else -}}
{{- .root.Release.Namespace -}}
{{- end -}}
{{- end }}

{{/* A GPU amount (number or numeric string) as integer milli-GPUs. */}}
{{- define "gpulab.milli" -}}
{{- $s := toString . -}}
{{- if not (regexMatch "^[0-9]+([.][0-9]{1,3})?$" $s) -}}
{{- fail (printf "gpulab: %q is not a GPU amount (a number with at most 3 decimals)" $s) -}}
{{- end -}}
{{- $parts := splitList "." $s -}}
{{- $whole := int64 (first $parts) -}}
{{- $frac := 0 -}}
{{- if gt (len $parts) 1 -}}
{{- $frac = int64 (printf "%s000" (index $parts 1) | trunc 3 | trimPrefix "0" | trimPrefix "0" | default "0") -}}
{{- end -}}
{{- add (mul $whole 1000) $frac -}}
{{- end }}

{{/* A team's guarantee and burst in milli-GPUs, as YAML {guarantee, burst}. */}}
{{- define "gpulab.teamMilli" -}}
{{- $g := include "gpulab.milli" (.guarantee | default 0) | int64 -}}
{{- $b := $g -}}
{{- if hasKey . "burst" -}}{{- $b = include "gpulab.milli" .burst | int64 -}}{{- end -}}
guarantee: {{ $g }}
burst: {{ $b }}
{{- end }}

{{/*
A team's or department's guarantee and burst in one GPU pool, in milli-GPUs, as
YAML {guarantee, burst}: its `pools.<pool>` entry, else its totals (which count
any pool). Call with (dict "spec" team-or-department "pool" name).
*/}}
{{- define "gpulab.poolMilli" -}}
{{- $q := get (.spec.pools | default dict) .pool -}}
{{- if $q -}}
{{- include "gpulab.teamMilli" $q -}}
{{- else -}}
{{- include "gpulab.teamMilli" .spec -}}
{{- end -}}
{{- end }}

{{/* The Kueue Cohort of a department: <release>-department-<name>. */}}
{{- define "gpulab.departmentCohort" -}}
{{- include "gpulab.clusterName" (list .root (printf "department-%s" .name)) -}}
{{- end }}

{{/*
The node labels of a GPU pool's Kueue ResourceFlavor: its node_labels, else the
sharing backend's node_selector for its GPU model (what the spawner puts on the
pods, spawner/core/sharing.py), else a failure that says what to set: Kueue
tells flavors apart by node labels only.
*/}}
{{- define "gpulab.poolNodeLabels" -}}
{{- $pool := .pool -}}
{{- $sh := .root.Values.gpulab.sharing | default dict -}}
{{- $backend := $pool.sharing | default ($sh.backend | default "whole") -}}
{{- $labels := $pool.node_labels | default (get ((get $sh $backend | default dict).node_selector | default dict) ($pool.gpu_model | default "")) -}}
{{- if not $labels -}}
{{- fail (printf "gpulab: pool %q needs node labels for its Kueue ResourceFlavor: set gpulab.pools[].node_labels, or gpulab.sharing.%s.node_selector.%s" $pool.name $backend ($pool.gpu_model | default "<model>")) -}}
{{- end -}}
{{- toYaml $labels -}}
{{- end }}

{{/*
The GPU resources the catalog's profiles make pods request, as YAML
{resource: {per: units per GPU}} or {resource: {share: milli-GPUs per unit}}.
It follows spawner/core/sharing.py (the spawner's mapping), profile by profile:
  1 GPU or more, any backend   whole resource (whole.resource, hami.resource,
                               else <backend>.whole_resource; nvidia.com/gpu)  per 1
  fraction, timeslice          timeslice.resource (nvidia.com/gpu.shared)     per replicas (4)
  fraction, mig                nvidia.com/mig-<slice> for every slice of the
                               profile's GPU model                            share of the slice
  fraction, hami               gpumem-percentage and gpucores resources       per 100
  fraction, kai                nothing (KAI counts the gpu-fraction annotation)
  fraction, whole              nothing (the spawner refuses it)
HAMi's GPU-count resource is never quota'd: every fractional HAMi pod asks
for one of it, so no number of GPUs bounds it.
*/}}
{{- define "gpulab.gpuResources" -}}
{{- $r := include "gpulab.gpuResourcesAndUncounted" . | fromYaml -}}
{{- $out := $r.counted | default dict -}}
{{- range $res, $_ := ($r.uncounted | default dict) -}}{{- $_ := unset $out $res -}}{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{/*
The resources a team's Kueue ClusterQueue covers: gpulab.gpuResources, plus
HAMi's GPU-count resource. Kueue admits a workload only if its ClusterQueue
covers every resource it requests ("resource nvidia.com/gpu unavailable in
ClusterQueue", pkg/scheduler/flavorassigner), and every HAMi pod requests it.
Counted per 100 per GPU: a HAMi pod takes at least 1 % of a GPU's memory, so
the memory percentage, not this count, is what bounds a team.
*/}}
{{- define "gpulab.kueueGpuResources" -}}
{{- $r := include "gpulab.gpuResourcesAndUncounted" . | fromYaml -}}
{{- $out := $r.counted | default dict -}}
{{- range $res, $_ := ($r.uncounted | default dict) -}}{{- $_ := set $out $res (dict "per" 100) -}}{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{- define "gpulab.gpuResourcesAndUncounted" -}}
{{- $v := .Values -}}
{{- $sh := $v.gpulab.sharing | default dict -}}
{{- $default := $sh.backend | default "whole" -}}
{{- $out := dict -}}
{{- $noQuota := dict -}}
{{- range $p := $v.gpulab.profiles -}}
{{- $b := $p.sharing | default $default -}}
{{- $opts := get $sh $b | default dict -}}
{{- $milli := 0 -}}
{{- if hasKey $p "gpu_milli" -}}{{- $milli = int64 (toString $p.gpu_milli | trimPrefix "0" | default "0") -}}
{{- else if hasKey $p "gpus" -}}{{- $milli = include "gpulab.milli" $p.gpus | int64 -}}{{- end -}}
{{- $wholeRes := $opts.whole_resource | default "nvidia.com/gpu" -}}
{{- if or (eq $b "whole") (eq $b "hami") -}}{{- $wholeRes = $opts.resource | default "nvidia.com/gpu" -}}{{- end -}}
{{- if eq $b "hami" -}}{{- $_ := set $noQuota ($opts.resource | default "nvidia.com/gpu") true -}}{{- end -}}
{{- if ge $milli 1000 -}}
{{- $cur := get $out $wholeRes | default (dict "per" 0) -}}
{{- $_ := set $out $wholeRes (dict "per" (max 1 ($cur.per | default 0))) -}}
{{- else if gt $milli 0 -}}
{{- if eq $b "timeslice" -}}
{{- $res := $opts.resource | default "nvidia.com/gpu.shared" -}}
{{- $cur := get $out $res | default (dict "per" 0) -}}
{{- $_ := set $out $res (dict "per" (max (int64 ($opts.replicas | default 4)) ($cur.per | default 0))) -}}
{{- else if eq $b "mig" -}}
{{- $model := $p.gpu_model | default "" -}}
{{- $names := get ($opts.profiles | default dict) $model | default (get $v.migDefaultProfiles $model) | default list -}}
{{- if not $names -}}
{{- fail (printf "gpulab: profile %q uses MIG on GPU model %q, which has no MIG profile table; add sharing.mig.profiles.%s" $p.slug $model $model) -}}
{{- end -}}
{{- $totC := 1 -}}{{- $totM := 1 -}}
{{- range $names -}}
{{- $totC = max $totC (regexReplaceAll "^([0-9]+)g[.]([0-9]+)gb$" . "${1}" | int64) -}}
{{- $totM = max $totM (regexReplaceAll "^([0-9]+)g[.]([0-9]+)gb$" . "${2}" | int64) -}}
{{- end -}}
{{- range $names -}}
{{- $c := regexReplaceAll "^([0-9]+)g[.]([0-9]+)gb$" . "${1}" | int64 -}}
{{- $m := regexReplaceAll "^([0-9]+)g[.]([0-9]+)gb$" . "${2}" | int64 -}}
{{- $share := max (div (add (mul $c 1000) (sub $totC 1)) $totC) (div (add (mul $m 1000) (sub $totM 1)) $totM) -}}
{{- $res := printf "nvidia.com/mig-%s" . -}}
{{- $cur := get $out $res | default (dict "share" $share) -}}
{{- $_ := set $out $res (dict "share" (min $share ($cur.share | default $share))) -}}
{{- end -}}
{{- else if eq $b "hami" -}}
{{- $_ := set $out ($opts.memory_percentage_resource | default "nvidia.com/gpumem-percentage") (dict "per" 100) -}}
{{- $_ := set $out ($opts.cores_resource | default "nvidia.com/gpucores") (dict "per" 100) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "counted" $out "uncounted" $noQuota) -}}
{{- end }}

{{/*
A team's amount in one resource's unit, rounded up. Call with
(list milli entry) where entry is {per: units per GPU} or {share: milli per unit}.
*/}}
{{- define "gpulab.units" -}}
{{- $m := index . 0 | int64 -}}
{{- $e := index . 1 -}}
{{- if hasKey $e "share" -}}
{{- $s := $e.share | int64 -}}
{{- div (add $m (sub $s 1)) $s -}}
{{- else -}}
{{- div (add (mul $m ($e.per | int64)) 999) 1000 -}}
{{- end -}}
{{- end }}

{{/* The catalog the hub reads: the gpulab block, each team's namespace made explicit. */}}
{{- define "gpulab.catalog" -}}
{{- $root := . -}}
{{- $teams := list -}}
{{- range .Values.gpulab.teams -}}
{{- $t := deepCopy . -}}
{{- if $root.Values.teamNamespaces.enabled -}}
{{- $_ := set $t "namespace" (include "gpulab.teamNamespace" (dict "team" . "root" $root)) -}}
{{- end -}}
{{- $teams = append $teams $t -}}
{{- end -}}
{{- $cat := dict "teams" $teams "profiles" (.Values.gpulab.profiles | default list) "sharing" (.Values.gpulab.sharing | default (dict "backend" "whole")) -}}
{{- if .Values.gpulab.prices -}}{{- $_ := set $cat "prices" .Values.gpulab.prices -}}{{- end -}}
{{- if .Values.gpulab.inventory -}}{{- $_ := set $cat "inventory" .Values.gpulab.inventory -}}{{- end -}}
{{- if .Values.gpulab.pools -}}{{- $_ := set $cat "pools" .Values.gpulab.pools -}}{{- end -}}
{{- if .Values.gpulab.departments -}}{{- $_ := set $cat "departments" .Values.gpulab.departments -}}{{- end -}}
{{- /* The cluster-scoped names the hub puts on its pods: this release's. */ -}}
{{- $classNames := dict -}}
{{- range include "gpulab.priorityClasses" . | fromYamlArray -}}
{{- $_ := set $classNames .class (include "gpulab.clusterName" (list $root .class)) -}}
{{- end -}}
{{- $_ := set $cat "priority_class_names" $classNames -}}
{{- if eq (include "gpulab.kaiInUse" .) "true" -}}
{{- $sharing := deepCopy (get $cat "sharing") -}}
{{- $kai := deepCopy ($sharing.kai | default dict) -}}
{{- $_ := set $kai "queue" (include "gpulab.kaiQueueTemplate" .) -}}
{{- $_ := set $sharing "kai" $kai -}}
{{- $_ := set $cat "sharing" $sharing -}}
{{- end -}}
{{- toYaml $cat -}}
{{- end }}

{{/* Integer milli-GPUs as a decimal number of GPUs: 750 -> 0.75, 2000 -> 2. */}}
{{- define "gpulab.gpusOfMilli" -}}
{{- $m := . | int64 -}}
{{- $frac := mod $m 1000 -}}
{{- if $frac -}}
{{- printf "%d.%s" (div $m 1000) (printf "%03d" $frac | trimSuffix "0" | trimSuffix "0") -}}
{{- else -}}
{{- div $m 1000 -}}
{{- end -}}
{{- end }}
