// Command grafana-dashboard writes gpulab's Grafana dashboard (helm/gpulab/dashboards/gpulab.json)
// with the Apache-licensed Grafana Foundation SDK's typed builders, and checks a dashboard file by
// decoding it strictly into the SDK's dashboard types.
//
//	grafana-dashboard            # print the dashboard's JSON
//	grafana-dashboard -check F   # decode F strictly (unknown or mistyped fields refused), validate it
//
// The committed JSON is this program's output (tests/integration/test_grafana_dashboard.py
// compares the two). Grafana itself is not used anywhere.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// kube-state-metrics exports the pod labels gpulab.io/team and gpulab.io/user (the chart's
// metricLabelsAllowlist) as label_gpulab_io_team and label_gpulab_io_user.
const (
	teamLabel = "label_gpulab_io_team"
	userLabel = "label_gpulab_io_user"
)

// podLabels: each gpulab pod's team and user, for the teams chosen in $team.
const podLabels = `max by (namespace, pod, ` + teamLabel + `, ` + userLabel + `) (kube_pod_labels{` +
	teamLabel + `!="", ` + teamLabel + `=~"$team"})`

// pods names each series of a dcgm-exporter metric with the pod that holds its GPU under `pod`
// and `namespace`, however Prometheus scraped it: with honorLabels the series keep dcgm-exporter's
// own labels; without (the GPU operator's ServiceMonitor by default, a plain scrape job) they are
// exported_pod / exported_namespace, and pod / namespace are the exporter's own.
func pods(metric string) string {
	return `(label_replace(label_replace(` + metric + `{exported_pod!=""}, "pod", "$1", "exported_pod", "(.+)"), ` +
		`"namespace", "$1", "exported_namespace", "(.+)") or ` + metric + `{exported_pod=""})`
}

// byPod joins a per-pod expression to the pods' team and user.
func byPod(expr string) string {
	return expr + ` * on (namespace, pod) group_left (` + teamLabel + `, ` + userLabel + `) ` + podLabels
}

// utilisation: DCGM_FI_DEV_GPU_UTIL (percent) of whole GPUs, the profiling metric of MIG
// instances and GPUs without GPU_UTIL as a percent, and HAMi's per-container utilisation of its
// vGPUs (0-100; dcgm-exporter names no HAMi pod).
var utilisation = `(` + pods("DCGM_FI_DEV_GPU_UTIL") + ` or (` + pods("DCGM_FI_PROF_GR_ENGINE_ACTIVE") + ` * 100) or ` +
	pods("hami_container_device_utilization_ratio") + `)`

// memoryUsed: frame buffer in use (MiB) on the GPUs each pod holds, and HAMi's vGPU memory of
// each container (bytes, made MiB).
var memoryUsed = `(` + pods("DCGM_FI_DEV_FB_USED") + ` or (` + pods("hami_vgpu_memory_used_bytes") + ` / 1048576))`

// datasource: the Prometheus the $datasource variable picks.
func datasource() common.DataSourceRef {
	kind, uid := "prometheus", "${datasource}"
	return common.DataSourceRef{Type: &kind, Uid: &uid}
}

type panel struct {
	title, description, unit string
	x, y, w, h               uint32
	targets                  []target
}

type target struct{ expr, legend string }

func (p panel) build() *timeseries.PanelBuilder {
	b := timeseries.NewPanelBuilder().
		Title(p.title).
		Legend(common.NewVizLegendOptionsBuilder().
			ShowLegend(true).
			DisplayMode(common.LegendDisplayModeList).
			Placement(common.LegendPlacementBottom)).
		Tooltip(common.NewVizTooltipOptionsBuilder().
			Mode(common.TooltipDisplayModeMulti).
			Sort(common.SortOrderDescending)).
		Description(p.description).
		Datasource(datasource()).
		Unit(p.unit).
		GridPos(dashboard.GridPos{X: p.x, Y: p.y, W: p.w, H: p.h})
	for i, t := range p.targets {
		b = b.WithTarget(prometheus.NewDataqueryBuilder().
			RefId(string(rune('A' + i))).
			Datasource(datasource()).
			Expr(t.expr).
			LegendFormat(t.legend))
	}
	return b
}

var panels = []panel{
	{
		title:       "GPU utilisation per team",
		description: "Mean utilisation of the GPUs (and MIG instances, HAMi vGPUs) held by each team's pods.",
		unit:        "percent", x: 0, y: 0, w: 12, h: 8,
		targets: []target{{
			expr:   `avg by (` + teamLabel + `) (` + byPod(utilisation) + `)`,
			legend: "{{" + teamLabel + "}}",
		}},
	},
	{
		title:       "GPU utilisation per user",
		description: "Mean utilisation of each user's GPUs; a flat zero is what the idle culler reclaims.",
		unit:        "percent", x: 12, y: 0, w: 12, h: 8,
		targets: []target{{
			expr:   `avg by (` + teamLabel + `, ` + userLabel + `) (` + byPod(utilisation) + `)`,
			legend: "{{" + teamLabel + "}} / {{" + userLabel + "}}",
		}},
	},
	{
		title: "GPU memory used per server",
		description: "Frame buffer memory in use (DCGM_FI_DEV_FB_USED, MiB) on the GPUs each gpulab pod holds; " +
			"a HAMi pod's own vGPU memory (hami_vgpu_memory_used_bytes). " +
			"A time-sliced or KAI-fraction pod shows its whole GPU's memory.",
		unit: "mbytes", x: 0, y: 8, w: 12, h: 8,
		targets: []target{{
			expr:   `sum by (` + teamLabel + `, ` + userLabel + `, namespace, pod) (` + byPod(memoryUsed) + `)`,
			legend: "{{" + userLabel + "}} {{namespace}}/{{pod}}",
		}},
	},
	{
		title:       "GPU memory used per team",
		description: "Frame buffer memory in use (MiB) on the GPUs held by each team's pods (HAMi pods: their vGPU memory).",
		unit:        "mbytes", x: 12, y: 8, w: 12, h: 8,
		targets: []target{{
			expr:   `sum by (` + teamLabel + `) (` + byPod(memoryUsed) + `)`,
			legend: "{{" + teamLabel + "}}",
		}},
	},
	{
		title:       "GPU quota used per team namespace",
		description: "Share of each team's ResourceQuota (its burst limit, in the sharing backend's unit) in use.",
		unit:        "percentunit", x: 0, y: 16, w: 12, h: 8,
		targets: []target{{
			expr: `sum by (namespace, resource) (kube_resourcequota{resourcequota="gpulab-gpus", type="used"}) / ` +
				`sum by (namespace, resource) (kube_resourcequota{resourcequota="gpulab-gpus", type="hard"})`,
			legend: "{{namespace}} {{resource}}",
		}},
	},
	{
		title:       "GPU units requested per team namespace",
		description: "What each team namespace's pods request of its GPU ResourceQuota, in the sharing backend's unit.",
		unit:        "short", x: 12, y: 16, w: 12, h: 8,
		targets: []target{{
			expr:   `sum by (namespace, resource) (kube_resourcequota{resourcequota="gpulab-gpus", type="used"})`,
			legend: "{{namespace}} {{resource}}",
		}},
	},
	{
		title: "Xid errors per GPU",
		description: "The last Xid error each GPU reported (DCGM_FI_DEV_XID_ERRORS; 0: none), with the pod holding it. " +
			"NVIDIA's Xid catalogue says what a code means; 48, 63, 64, 74, 79, 94 and 95 usually need the node drained.",
		unit: "none", x: 0, y: 24, w: 12, h: 8,
		targets: []target{{
			expr:   `max by (Hostname, hostname, gpu, UUID, namespace, pod) (` + pods("DCGM_FI_DEV_XID_ERRORS") + `)`,
			legend: "{{Hostname}}{{hostname}} GPU {{gpu}} {{namespace}}/{{pod}}",
		}},
	},
	{
		title: "ECC errors and row remapping per GPU",
		description: "Volatile ECC errors over $__rate_interval (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL double-bit, " +
			"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL single-bit; helm/values-gpu-operator.yaml turns these counters on) " +
			"and rows remapped for uncorrectable errors (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS; " +
			"DCGM_FI_DEV_ROW_REMAP_FAILURE 1: the GPU needs a reset or service).",
		unit: "short", x: 12, y: 24, w: 12, h: 8,
		targets: []target{
			{
				expr:   `sum by (Hostname, hostname, gpu, UUID) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[$__rate_interval]))`,
				legend: "double-bit {{Hostname}}{{hostname}} GPU {{gpu}}",
			},
			{
				expr:   `sum by (Hostname, hostname, gpu, UUID) (increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[$__rate_interval]))`,
				legend: "single-bit {{Hostname}}{{hostname}} GPU {{gpu}}",
			},
			{
				expr:   `max by (Hostname, hostname, gpu, UUID) (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS)`,
				legend: "uncorrectable rows remapped {{Hostname}}{{hostname}} GPU {{gpu}}",
			},
			{
				expr:   `max by (Hostname, hostname, gpu, UUID) (DCGM_FI_DEV_ROW_REMAP_FAILURE)`,
				legend: "row remap failed {{Hostname}}{{hostname}} GPU {{gpu}}",
			},
		},
	},
	{
		title: "Servers the idle culler cannot see, by reason",
		description: "GPU servers no utilisation series names (gpulab_culler_unattributed_servers): idle GPU " +
			"reclaim is off for them. The admin page lists them; docs/idle-culler.md says what each reason needs.",
		unit: "short", x: 0, y: 32, w: 12, h: 8,
		targets: []target{{
			expr:   `sum by (reason) (gpulab_culler_unattributed_servers)`,
			legend: "{{reason}}",
		}},
	},
	{
		title:       "Idle GPU-hours observed before reclaims, per team",
		description: "GPU-hours the gpulab idle culler took back from idle sessions, over the dashboard's time range.",
		unit:        "h", x: 12, y: 32, w: 12, h: 8,
		targets: []target{{
			expr:   `sum by (team) (increase(gpulab_culler_idle_gpu_hours_before_reclaim_total[$__range]))`,
			legend: "{{team}}",
		}},
	},
}

func build() (dashboard.Dashboard, error) {
	prom := "prometheus"
	all := "$__all"
	team := dashboard.NewQueryVariableBuilder("team").
		Label("Team").
		Description("The teams whose pods the per-team and per-user panels show.").
		Datasource(datasource()).
		Query(dashboard.StringOrMap{Map: map[string]any{
			"qryType": 1,
			"query":   `label_values(kube_pod_labels{` + teamLabel + `!=""}, ` + teamLabel + `)`,
			"refId":   "PrometheusVariableQueryEditor-VariableQuery",
		}}).
		Definition(`label_values(kube_pod_labels{` + teamLabel + `!=""}, ` + teamLabel + `)`).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalAsc).
		Multi(true).
		IncludeAll(true).
		Current(dashboard.VariableOption{
			Text:  dashboard.StringOrArrayOfString{ArrayOfString: []string{"All"}},
			Value: dashboard.StringOrArrayOfString{ArrayOfString: []string{all}},
		})
	b := dashboard.NewDashboardBuilder("gpulab GPUs").
		Uid("gpulab-gpus").
		Description("GPU utilisation, memory and health per team and user, quota use, and the gpulab idle culler's reclaims and blind spots.").
		Tags([]string{"gpulab", "gpu"}).
		Timezone(common.TimeZoneBrowser).
		Editable().
		Refresh("1m").
		Time("now-24h", "now").
		Version(2).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Prometheus").Type(prom)).
		WithVariable(team)
	for _, p := range panels {
		b = b.WithPanel(p.build())
	}
	return b.Build()
}

// check decodes a dashboard file strictly into the SDK's types and validates it.
func check(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var d dashboard.Dashboard
	if err := failed(d.UnmarshalJSONStrict(raw)); err != nil {
		return fmt.Errorf("%s does not decode strictly into the SDK's dashboard types: %w", path, err)
	}
	if err := failed(d.Validate()); err != nil {
		return fmt.Errorf("%s breaks the SDK's dashboard constraints: %w", path, err)
	}
	return nil
}

// failed is err, or nil for the empty cog.BuildErrors the SDK's strict decoders return (as a
// non-nil error interface) when nothing failed.
func failed(err error) error {
	if errs, ok := err.(cog.BuildErrors); ok && len(errs) == 0 {
		return nil
	}
	return err
}

func main() {
	checkPath := flag.String("check", "", "decode this dashboard JSON strictly into the SDK's types and validate it")
	flag.Parse()
	plugins.RegisterDefaultPlugins()
	if *checkPath != "" {
		if err := check(*checkPath); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	d, err := build()
	if err != nil {
		for _, e := range err.(cog.BuildErrors) {
			fmt.Fprintln(os.Stderr, e)
		}
		os.Exit(1)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(d); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(out.Bytes())
}
