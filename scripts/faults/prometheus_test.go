//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// timeScale divides every duration of the alert rules (for: and range
// vectors): a rule's 2m becomes 4s, so a scenario sees an alert fire and
// resolve in seconds. The expressions are the project's, unchanged.
const timeScale = 30

// prometheus is a real Prometheus (Debian's package) scraping the scenario's
// processes every second and evaluating the project's rules.
type prometheus struct {
	addr string
	dir  string
	cmd  *exec.Cmd
}

var durationRE = regexp.MustCompile(`(for: |\[)(\d+)([smh])`)

// scaleRules rewrites the durations of a rule file.
func scaleRules(src []byte) []byte {
	return durationRE.ReplaceAllFunc(src, func(m []byte) []byte {
		g := durationRE.FindSubmatch(m)
		n, _ := strconv.Atoi(string(g[2]))
		secs := map[string]int{"s": 1, "m": 60, "h": 3600}[string(g[3])] * n
		return []byte(fmt.Sprintf("%s%ds", g[1], max(secs/timeScale, 1)))
	})
}

func startPrometheus(t *testing.T, s *suite) *prometheus {
	t.Helper()
	if _, err := exec.LookPath("prometheus"); err != nil {
		t.Fatal("prometheus is missing (apt-get install prometheus)")
	}
	p := &prometheus{addr: freeAddr(t), dir: filepath.Join(s.work, "prometheus")}
	must(t, os.MkdirAll(p.dir, 0o755))
	rules, err := os.ReadFile(filepath.Join(s.root, "deploy/prometheus/alerts.yml"))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(p.dir, "alerts.yml"), scaleRules(rules), 0o644))
	for _, job := range []string{"promotion", "catalog"} {
		must(t, os.WriteFile(p.targetsFile(job), []byte("[]"), 0o644))
	}
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 900ms}
rule_files: [%q]
scrape_configs:
  - job_name: promotion
    file_sd_configs: [{files: [%q], refresh_interval: 1s}]
  - job_name: catalog
    file_sd_configs: [{files: [%q], refresh_interval: 1s}]
`, filepath.Join(p.dir, "alerts.yml"), p.targetsFile("promotion"), p.targetsFile("catalog"))
	must(t, os.WriteFile(filepath.Join(p.dir, "prometheus.yml"), []byte(cfg), 0o644))
	log, err := os.Create(filepath.Join(p.dir, "prometheus.log"))
	must(t, err)
	p.cmd = exec.Command("prometheus", "--config.file="+filepath.Join(p.dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(p.dir, "tsdb"), "--web.listen-address="+p.addr, "--log.level=warn")
	p.cmd.Stdout, p.cmd.Stderr = log, log
	must(t, p.cmd.Start())
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait(); log.Close() })
	if _, ok := eventually(context.Background(), 60*time.Second, func() bool {
		resp, err := http.Get("http://" + p.addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); !ok {
		t.Fatal("prometheus did not become ready")
	}
	return p
}

func (p *prometheus) targetsFile(job string) string {
	return filepath.Join(p.dir, "targets-"+job+".json")
}

// scrape makes Prometheus scrape exactly procs (written atomically).
func (p *prometheus) scrape(t *testing.T, procs []*proc) {
	t.Helper()
	groups := map[string][]map[string]any{"promotion": {}, "catalog": {}}
	for _, pr := range procs {
		groups[pr.job] = append(groups[pr.job], map[string]any{
			"targets": []string{pr.internal}, "labels": map[string]string{"process": pr.name}})
	}
	for job, g := range groups {
		raw, err := json.Marshal(g)
		must(t, err)
		tmp := p.targetsFile(job) + ".tmp"
		must(t, os.WriteFile(tmp, raw, 0o644))
		must(t, os.Rename(tmp, p.targetsFile(job)))
	}
}

// get reads a Prometheus API answer into data. Prometheus unreachable, an
// answer other than 200, one that does not decode, or one whose status is
// not "success" is an error: a check that cannot ask Prometheus fails.
func (p *prometheus) get(path string, params url.Values, data any) error {
	c := http.Client{Timeout: 10 * time.Second}
	u := "http://" + p.addr + path
	if params != nil {
		u += "?" + params.Encode()
	}
	resp, err := c.Get(u)
	if err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	defer resp.Body.Close()
	var body struct {
		Status    string          `json:"status"`
		Error     string          `json:"error"`
		ErrorType string          `json:"errorType"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("prometheus %s: %s: %w", path, resp.Status, err)
	}
	if resp.StatusCode != http.StatusOK || body.Status != "success" {
		return fmt.Errorf("prometheus %s: %s, status %q: %s %s", path, resp.Status, body.Status, body.ErrorType, body.Error)
	}
	if err := json.Unmarshal(body.Data, data); err != nil {
		return fmt.Errorf("prometheus %s: data: %w", path, err)
	}
	return nil
}

// alertStates is the state (pending or firing) of every active alert, by name.
func (p *prometheus) alertStates() (map[string]string, error) {
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", nil, &data); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, a := range data.Alerts {
		if name := a.Labels["alertname"]; out[name] != "firing" {
			out[name] = a.State
		}
	}
	return out, nil
}

// firing reports whether alert is firing now.
func (p *prometheus) firing(alert string) (bool, error) {
	states, err := p.alertStates()
	return states[alert] == "firing", err
}

// sample is one series of an instant vector.
type sample struct {
	labels map[string]string
	value  float64
}

// query runs an instant query and returns its vector.
func (p *prometheus) query(q string) ([]sample, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("prometheus query %s: a %s, not a vector", q, data.ResultType)
	}
	out := make([]sample, len(data.Result))
	for i, r := range data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("prometheus query %s: value %v: %w", q, r.Value[1], err)
		}
		out[i] = sample{labels: r.Metric, value: v}
	}
	return out, nil
}

// one runs an instant query that must return exactly one series.
func (p *prometheus) one(q string) (float64, error) {
	got, err := p.query(q)
	if err != nil {
		return 0, err
	}
	if len(got) != 1 {
		return 0, fmt.Errorf("prometheus query %s: %d series, want 1", q, len(got))
	}
	return got[0].value, nil
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
