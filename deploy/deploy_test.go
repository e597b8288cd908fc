package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"

	"github.com/envoy-rls/envoy-rls/pkg/metrics"
)

const (
	rulesFile     = "alerts/envoy-rls.rules.yml"
	rulesTestFile = "alerts/envoy-rls.rules.test.yml"
	dashboardFile = "grafana/envoy-rls.json"

	promtoolHint = "run `make test` (scripts/install-deps.sh installs Debian's prometheus package, which provides promtool), or apt-get install prometheus"
)

func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found: %s", promtoolHint)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rf
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// dashboardExprs returns every target expression, by panel title.
func dashboardExprs(d dashboard) map[string][]string {
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], tg.Expr)
		}
	}
	return out
}

// grafanaVars replaces Grafana's variables with values Prometheus accepts.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m",
	"$job", ".*", "$instance", ".*", "$domain", ".*")

func TestAlertRulesCheckAndUnitTests(t *testing.T) {
	out := promtool(t, ".", "check", "rules", rulesFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules: %s", out)
	}
	out = promtool(t, "alerts", "test", "rules", filepath.Base(rulesTestFile))
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: %s", out)
	}

	// Every alert is documented, has a severity, and is exercised by a
	// unit test that expects it to fire.
	tests, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(tests, &tf); err != nil {
		t.Fatal(err)
	}
	fires := map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if sev := r.Labels["severity"]; sev != "warning" && sev != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", r.Alert)
			}
			if !fires[r.Alert] {
				t.Errorf("%s: no unit test in %s expects it to fire", r.Alert, rulesTestFile)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerting rules")
	}
}

// TestDashboardExpressionsParse has promtool parse every dashboard
// expression, as recording rules of a throw-away rule file.
func TestDashboardExpressionsParse(t *testing.T) {
	var rf struct {
		Groups []map[string]any `yaml:"groups"`
	}
	var rules []map[string]string
	for title, exprs := range dashboardExprs(readDashboard(t)) {
		for i, e := range exprs {
			rules = append(rules, map[string]string{
				"record": fmt.Sprintf("dashboard:%s:%d", regexp.MustCompile(`\W+`).ReplaceAllString(title, "_"), i),
				"expr":   grafanaVars.Replace(e),
			})
		}
	}
	rf.Groups = append(rf.Groups, map[string]any{"name": "dashboard", "rules": rules})
	b, err := yaml.Marshal(rf)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.rules.yml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := promtool(t, dir, "check", "rules", "dashboard.rules.yml")
	if !strings.Contains(out, fmt.Sprintf("SUCCESS: %d rules found", len(rules))) {
		t.Errorf("promtool check rules on the dashboard's expressions: %s", out)
	}
}

func TestDashboardShape(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" || d.SchemaVersion == 0 || len(d.Panels) == 0 {
		t.Fatalf("dashboard lacks title, uid, schemaVersion or panels: %+v", d)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	ids := map[int]bool{}
	varRef := regexp.MustCompile(`\$\{?(\w+)`)
	type rect struct{ x, y, w, h int }
	var placed []rect
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if p.Title == "" || p.Type == "" || g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %d (%q): needs a type, a title and a gridPos within 24 columns: %+v", p.ID, p.Title, g)
		}
		for _, r := range placed {
			if g.X < r.x+r.w && r.x < g.X+g.W && g.Y < r.y+r.h && r.y < g.Y+g.H {
				t.Errorf("panel %q overlaps another at %+v", p.Title, g)
			}
		}
		placed = append(placed, rect{g.X, g.Y, g.W, g.H})
		if p.Type == "row" {
			continue
		}
		if len(p.Datasource) == 0 || len(p.Targets) == 0 {
			t.Errorf("panel %q: needs a datasource and targets", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: target %+v needs a unique refId and an expr", p.Title, tg)
			}
			refs[tg.RefID] = true
			for _, m := range varRef.FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.HasPrefix(m[1], "__") && !vars[m[1]] {
					t.Errorf("panel %q: variable $%s is not defined", p.Title, m[1])
				}
			}
		}
	}
	// The dashboard shows what operators need.
	all := ""
	for _, exprs := range dashboardExprs(d) {
		all += strings.Join(exprs, "\n") + "\n"
	}
	for _, want := range []string{
		`decision="over_limit"`, "envoy_rls_decisions_total", "envoy_rls_requests_total",
		"envoy_rls_request_duration_seconds_bucket", "envoy_rls_store_duration_seconds_bucket",
		"envoy_rls_store_errors_total", "envoy_rls_fallback_active", "envoy_rls_circuit_breaker_state",
		"envoy_rls_instances", "envoy_rls_config_reloads_total", "envoy_rls_config_last_reload_successful",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no dashboard panel uses %s", want)
		}
	}
}

// exported returns the metric families envoy-rls exports, with their label
// names, read from pkg/metrics itself: every collector metrics.New (and
// InstancesFunc, ListenerTLS, RedisTLS) registers is described, so vectors without children are
// listed too; their types, and the gathered families, come from a gather.
func exported(t *testing.T) (labels map[string][]string, types map[string]dto.MetricType, fams []*dto.MetricFamily) {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec := &describing{Registerer: reg, labels: map[string][]string{}}
	m, err := metrics.New(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.InstancesFunc(func() int { return 1 }); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ListenerTLS(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.RedisTLS(true); err != nil {
		t.Fatal(err)
	}
	if len(rec.labels) == 0 {
		t.Fatal("metrics.New registered nothing")
	}
	fams, err = reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	types = map[string]dto.MetricType{}
	for _, f := range fams {
		types[f.GetName()] = f.GetType()
	}
	return rec.labels, types, fams
}

// describing is a Registerer that records the name and label names of
// every collector registered through it.
type describing struct {
	prometheus.Registerer
	labels map[string][]string
}

var (
	descName   = regexp.MustCompile(`fqName: "([^"]+)"`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)
)

func (d *describing) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		s := desc.String()
		n, l := descName.FindStringSubmatch(s), descLabels.FindStringSubmatch(s)
		if n == nil || l == nil {
			return fmt.Errorf("cannot read %s", s)
		}
		var names []string
		if l[1] != "" {
			names = strings.Split(l[1], ",")
		}
		d.labels[n[1]] = names
	}
	return d.Registerer.Register(c)
}

func (d *describing) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}

var (
	metricRef  = regexp.MustCompile(`\b(envoy_rls_[a-zA-Z0-9_]+|up)\b`)
	matcherRef = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"`)
	groupRef   = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
)

// checkExpr reports metrics and labels of expr that envoy-rls does not
// export. Target labels (job, instance) are always allowed; le with a
// histogram's _bucket series.
func checkExpr(labels map[string][]string, types map[string]dto.MetricType, expr string) []string {
	var errs []string
	allowed := map[string]bool{"job": true, "instance": true}
	refs := metricRef.FindAllString(expr, -1)
	if len(refs) == 0 {
		errs = append(errs, "uses no envoy-rls metric")
	}
	for _, ref := range refs {
		if ref == "up" {
			continue
		}
		name := ref
		if _, ok := labels[name]; !ok {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				base, found := strings.CutSuffix(ref, suffix)
				if !found {
					continue
				}
				if typ, ok := types[base]; ok && (typ == dto.MetricType_HISTOGRAM || (typ == dto.MetricType_SUMMARY && suffix != "_bucket")) {
					name = base
					if suffix == "_bucket" {
						allowed["le"] = true
					}
				}
			}
		}
		ls, ok := labels[name]
		if !ok {
			errs = append(errs, fmt.Sprintf("metric %s is not exported by pkg/metrics", ref))
			continue
		}
		for _, l := range ls {
			allowed[l] = true
		}
	}
	var used []string
	for _, m := range matcherRef.FindAllStringSubmatch(expr, -1) {
		used = append(used, m[1])
	}
	for _, m := range groupRef.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				used = append(used, l)
			}
		}
	}
	for _, l := range used {
		if !allowed[l] {
			errs = append(errs, fmt.Sprintf("label %s is not a label of the metrics used", l))
		}
	}
	return errs
}

func TestMetricsAndLabelsExist(t *testing.T) {
	labels, types, _ := exported(t)
	// The checker itself catches what it should.
	for _, bad := range []string{
		`rate(envoy_rls_no_such_total[5m])`,
		`sum by (client_ip) (rate(envoy_rls_requests_total[5m]))`,
		`envoy_rls_fallback_active{le="1"}`,
		`rate(envoy_rls_decisions_total_bucket[5m])`,
		`vector(1)`,
	} {
		if len(checkExpr(labels, types, bad)) == 0 {
			t.Errorf("checkExpr accepted %s", bad)
		}
	}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			for _, e := range checkExpr(labels, types, r.Expr) {
				t.Errorf("%s %s: %s", rulesFile, r.Alert+r.Record, e)
			}
		}
	}
	titles := dashboardExprs(readDashboard(t))
	keys := make([]string, 0, len(titles))
	for k := range titles {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, title := range keys {
		for _, expr := range titles[title] {
			for _, e := range checkExpr(labels, types, expr) {
				t.Errorf("%s panel %q: %s", dashboardFile, title, e)
			}
		}
	}
}
