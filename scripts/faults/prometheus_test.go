//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
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
			"targets": []string{pr.addr}, "labels": map[string]string{"process": pr.name}})
	}
	for job, g := range groups {
		raw, err := json.Marshal(g)
		must(t, err)
		tmp := p.targetsFile(job) + ".tmp"
		must(t, os.WriteFile(tmp, raw, 0o644))
		must(t, os.Rename(tmp, p.targetsFile(job)))
	}
}

// firing reports whether alert is firing now.
func (p *prometheus) firing(alert string) bool {
	resp, err := http.Get("http://" + p.addr + "/api/v1/alerts")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return false
	}
	for _, a := range body.Data.Alerts {
		if a.Labels["alertname"] == alert && a.State == "firing" {
			return true
		}
	}
	return false
}

// up is the sum of up for job, or -1 when Prometheus has no such series.
func (p *prometheus) up(job string) float64 {
	resp, err := http.Get("http://" + p.addr + "/api/v1/query?query=" + "sum(up%7Bjob%3D%22" + job + "%22%7D)")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil || len(body.Data.Result) == 0 {
		return -1
	}
	v, _ := strconv.ParseFloat(fmt.Sprint(body.Data.Result[0].Value[1]), 64)
	return v
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
