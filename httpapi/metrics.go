package httpapi

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
)

// Metrics counts tool calls for /metrics, in the Prometheus text format:
//
//	sandboxd_sessions                        live sessions
//	sandboxd_sessions_lost_total             sessions ended because their workspace died
//	sandboxd_sessions_paused                 paused sessions (no CPU, no memory)
//	sandboxd_removals_pending                workspace removals the engine refused, waiting for a retry
//	sandboxd_removals_failed_total           failed attempts to remove a workspace (each is retried)
//	sandboxd_pool_ready{image[,template]}    ready workspaces of each warm pool
//	sandboxd_pool_size{image}                each pool's target size
//	sandboxd_pool_claimed_total{image}       workspaces sessions took from it
//	sandboxd_pool_lost_total{image}          ready workspaces that died and were replaced
//	sandboxd_egress_connections_total{outcome} egress destination connections and refusals
//	sandboxd_egress_bytes_total{direction}   bytes through the egress proxy (up, down)
//	sandboxd_snapshots                       tenants' snapshots in the store
//	sandboxd_snapshots_bytes                 what they hold there (stored bytes)
//	sandboxd_templates, sandboxd_templates_bytes  the operator's templates
//	sandboxd_snapshot_operations_total{op,outcome} snapshot, restore, fork, delete, pause, resume
//	sandboxd_tool_calls_total{tool,outcome}  calls by tool and outcome
//	sandboxd_tool_call_duration_seconds{tool} a histogram of call latency
//
// Labels never name tenants or sessions. Tool names other than the known
// tools (and "upload", "download") are counted as "other", so a client
// cannot grow the label set. It is safe for concurrent use.
type Metrics struct {
	mu    sync.Mutex
	calls map[[2]string]uint64 // tool, outcome
	hist  map[string]*histogram
}

// NewMetrics returns empty metrics.
func NewMetrics() *Metrics {
	return &Metrics{calls: map[[2]string]uint64{}, hist: map[string]*histogram{}}
}

// buckets are the upper bounds of the latency histogram, in seconds.
var buckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

type histogram struct {
	counts []uint64 // per bucket, not cumulative; one more for +Inf
	sum    float64
	n      uint64
}

// Observe records one call; pass it to runner.WithObserver.
func (m *Metrics) Observe(ev runner.CallEvent) {
	tool := ev.Tool
	if !slices.Contains(tools.AllTools, tool) && tool != tools.LoadSkill && tool != "upload" && tool != "download" && tool != opProviderRun && tool != "snapshot" && tool != "baseline" {
		tool = "other"
	}
	secs := ev.Duration.Seconds()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[[2]string{tool, ev.Outcome}]++
	if ev.Outcome == runner.OutcomeBusy || ev.Outcome == runner.OutcomeClosed && ev.Duration == 0 {
		return // refused before it ran: no latency
	}
	h := m.hist[tool]
	if h == nil {
		h = &histogram{counts: make([]uint64, len(buckets)+1)}
		m.hist[tool] = h
	}
	i, _ := slices.BinarySearch(buckets, secs)
	h.counts[i]++
	h.sum += secs
	h.n++
}

// write writes every metric in the text exposition format.
func (m *Metrics) write(w io.Writer, st runner.Stats) {
	var b strings.Builder
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	total := 0
	for _, n := range st.Sessions {
		total += n
	}
	family("sandboxd_sessions", "gauge", "Live sessions.")
	fmt.Fprintf(&b, "sandboxd_sessions %d\n", total)
	family("sandboxd_sessions_lost_total", "counter", "Sessions ended because their workspace died (a container killed or removed from outside).")
	fmt.Fprintf(&b, "sandboxd_sessions_lost_total %d\n", st.Lost)
	family("sandboxd_sessions_paused", "gauge", "Paused sessions: their files kept, no CPU or memory held (POST /v1/sessions/ID/pause).")
	fmt.Fprintf(&b, "sandboxd_sessions_paused %d\n", st.Paused)
	family("sandboxd_removals_pending", "gauge", "Removals of closed workspaces (containers, volumes) the engine refused, retried in the background until they succeed.")
	fmt.Fprintf(&b, "sandboxd_removals_pending %d\n", st.Removals.Pending)
	family("sandboxd_removals_failed_total", "counter", "Failed attempts to remove a closed workspace; each is retried.")
	fmt.Fprintf(&b, "sandboxd_removals_failed_total %d\n", st.Removals.Failed)
	family("sandboxd_egress_connections_total", "counter", "Egress proxy destination connections and refusals by outcome (ok, refused, failed, capped).")
	for _, outcome := range slices.Sorted(maps.Keys(st.Egress.Connections)) {
		fmt.Fprintf(&b, "sandboxd_egress_connections_total{outcome=%s} %d\n", quote(outcome), st.Egress.Connections[outcome])
	}
	family("sandboxd_egress_bytes_total", "counter", "Bytes through the egress proxy: up (to destinations) and down (from them).")
	fmt.Fprintf(&b, "sandboxd_egress_bytes_total{direction=\"up\"} %d\nsandboxd_egress_bytes_total{direction=\"down\"} %d\n", st.Egress.BytesUp, st.Egress.BytesDown)
	family("sandboxd_pool_ready", "gauge", "Ready workspaces waiting in each warm pool.")
	for _, p := range st.Pools {
		fmt.Fprintf(&b, "sandboxd_pool_ready{%s} %d\n", poolLabels(p), p.Ready)
	}
	family("sandboxd_pool_size", "gauge", "The size each warm pool keeps.")
	for _, p := range st.Pools {
		fmt.Fprintf(&b, "sandboxd_pool_size{%s} %d\n", poolLabels(p), p.Size)
	}
	family("sandboxd_pool_claimed_total", "counter", "Workspaces sessions took from each warm pool.")
	for _, p := range st.Pools {
		fmt.Fprintf(&b, "sandboxd_pool_claimed_total{%s} %d\n", poolLabels(p), p.Claimed)
	}
	family("sandboxd_pool_lost_total", "counter", "Ready workspaces of each warm pool that died before a claim, and were replaced.")
	for _, p := range st.Pools {
		fmt.Fprintf(&b, "sandboxd_pool_lost_total{%s} %d\n", poolLabels(p), p.Lost)
	}
	if sn := st.Snapshots; sn != nil {
		family("sandboxd_snapshots", "gauge", "Tenants' snapshots in the store (forks' passing ones included).")
		fmt.Fprintf(&b, "sandboxd_snapshots %d\n", sn.Snapshots)
		family("sandboxd_snapshots_bytes", "gauge", "Bytes the tenants' snapshots hold in the store: every file at its full size, with its entry's header.")
		fmt.Fprintf(&b, "sandboxd_snapshots_bytes %d\n", sn.StoredBytes)
		family("sandboxd_templates", "gauge", "The operator's templates in the store.")
		fmt.Fprintf(&b, "sandboxd_templates %d\n", sn.Templates)
		family("sandboxd_templates_bytes", "gauge", "Bytes the templates hold in the store.")
		fmt.Fprintf(&b, "sandboxd_templates_bytes %d\n", sn.TemplateBytes)
		family("sandboxd_snapshot_operations_total", "counter", "Snapshot operations (snapshot, restore, fork, delete, pause, resume) by outcome (ok, limit, nospace, corrupt, notfound, timeout, failed).")
		ops := slices.SortedFunc(maps.Keys(sn.Ops), func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
		for _, k := range ops {
			fmt.Fprintf(&b, "sandboxd_snapshot_operations_total{op=%s,outcome=%s} %d\n", quote(k[0]), quote(k[1]), sn.Ops[k])
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	family("sandboxd_tool_calls_total", "counter", "Tool calls by tool and outcome (ok, error, failed, busy, closed).")
	keys := make([][2]string, 0, len(m.calls))
	for k := range m.calls {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
	for _, k := range keys {
		fmt.Fprintf(&b, "sandboxd_tool_calls_total{tool=%s,outcome=%s} %d\n", quote(k[0]), quote(k[1]), m.calls[k])
	}
	family("sandboxd_tool_call_duration_seconds", "histogram", "Tool call latency in seconds.")
	for _, tool := range slices.Sorted(maps.Keys(m.hist)) {
		h := m.hist[tool]
		var cum uint64
		for i, c := range h.counts {
			cum += c
			le := "+Inf"
			if i < len(buckets) {
				le = strconv.FormatFloat(buckets[i], 'g', -1, 64)
			}
			fmt.Fprintf(&b, "sandboxd_tool_call_duration_seconds_bucket{tool=%s,le=%q} %d\n", quote(tool), le, cum)
		}
		fmt.Fprintf(&b, "sandboxd_tool_call_duration_seconds_sum{tool=%s} %s\n", quote(tool), formatFloat(h.sum))
		fmt.Fprintf(&b, "sandboxd_tool_call_duration_seconds_count{tool=%s} %d\n", quote(tool), h.n)
	}
	io.WriteString(w, b.String())
}

// poolLabels are a pool's labels: its image, and its template when it has
// one.
func poolLabels(p runner.PoolStats) string {
	l := "image=" + quote(p.Image)
	if p.Template != "" {
		l += ",template=" + quote(p.Template)
	}
	return l
}

// quote writes a label value: backslash, double quote and newline escaped.
func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

func formatFloat(f float64) string {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return "0"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
