package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/promoflow/promoflow/router"
)

// The chart and the values it is checked with: its defaults, and
// production's shape (SASL_SSL with a private CA, PgBouncer, the monitors
// and the operator Jobs).
const (
	chartDir         = "../deploy/helm/promoflow"
	chartSASLValues  = chartDir + "/ci/sasl-ssl-pgbouncer-values.yaml"
	chartAlertsRules = "../deploy/prometheus/alerts.yml"
)

// helmBin is the helm that scripts/helm.sh built ($PROMOFLOW_HELM), or one on
// PATH. CI must have it; elsewhere the chart's tests skip without it.
func helmBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("PROMOFLOW_HELM"); bin != "" {
		return bin
	}
	if bin, err := exec.LookPath("helm"); err == nil {
		return bin
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("helm is missing: scripts/test.sh installs it with scripts/helm.sh")
	}
	t.Skip("helm is not installed: PROMOFLOW_HELM=$(bash scripts/helm.sh) builds it into the cache folder")
	return ""
}

func runHelm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm %s:\n%s%s", strings.Join(args, " "), out, stderr.String())
	return out
}

// withValues is args with the values file, when one is given.
func withValues(file string, args ...string) []string {
	if file != "" {
		args = append(args, "-f", file)
	}
	return args
}

// chartScheme knows every kind the chart may render.
func chartScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme,
		batchv1.AddToScheme, networkingv1.AddToScheme, monitoringv1.AddToScheme} {
		require.NoError(t, add(s))
	}
	return s
}

// renderChart runs helm template (with each of set as --set) and decodes every object it renders into
// its Kubernetes API type, strictly: an unknown or duplicated field, or a
// kind of no known group, fails the test.
func renderChart(t *testing.T, values string, set ...string) []runtime.Object {
	t.Helper()
	args := withValues(values, "template", "promoflow", chartDir)
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out := runHelm(t, args...)
	scheme := chartScheme(t)
	decoder := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
	reader := kyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	var objs []runtime.Object
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if asJSON, err := yaml.YAMLToJSON(doc); err == nil && string(asJSON) == "null" {
			continue // comments alone
		}
		obj, gvk, err := decoder.Decode(doc, nil, nil)
		require.NoError(t, err, "the chart renders an object the Kubernetes API refuses:\n%s", doc)
		t.Logf("decoded strictly: %s %s", gvk.GroupVersion(), gvk.Kind)
		objs = append(objs, obj)
	}
	return objs
}

// helpSettings are the environment variables `promoflow <command> --help` lists.
var helpSettings = struct {
	sync.Mutex
	of map[string]map[string]bool
}{of: map[string]map[string]bool{}}

func settingsOf(t *testing.T, command string) map[string]bool {
	t.Helper()
	helpSettings.Lock()
	defer helpSettings.Unlock()
	if s, ok := helpSettings.of[command]; ok {
		return s
	}
	code, out := runCommand(t, nil, 30*time.Second, command, "--help")
	require.Equal(t, 0, code, out)
	s := map[string]bool{}
	for _, m := range regexp.MustCompile(`\$([A-Z][A-Z0-9_]*)`).FindAllStringSubmatch(out, -1) {
		s[m[1]] = true
	}
	require.NotEmpty(t, s, "promoflow %s --help lists no setting:\n%s", command, out)
	helpSettings.of[command] = s
	return s
}

// checkPod checks a pod's containers: each runs a promoflow command (its
// first argument), gets only settings that command lists in --help, and
// every file a setting names lies in a Secret mounted read-only.
func checkPod(t *testing.T, what string, pod corev1.PodSpec) {
	t.Helper()
	secrets := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = true
		}
	}
	for _, c := range pod.Containers {
		require.NotEmpty(t, c.Args, "%s: the container names its promoflow command", what)
		known := settingsOf(t, c.Args[0])
		for _, e := range c.Env {
			require.True(t, known[e.Name], "%s: %s gets $%s, which `promoflow %s --help` does not list", what, c.Name, e.Name, c.Args[0])
			require.NotEqual(t, "KAFKA_SASL_PASSWORD", e.Name, "%s: the SASL password comes from a file", what)
			if !strings.HasPrefix(e.Value, "/") {
				continue
			}
			mounted := false
			for _, m := range c.VolumeMounts {
				if strings.HasPrefix(e.Value, m.MountPath+"/") && m.ReadOnly && secrets[m.Name] {
					mounted = true
				}
			}
			require.True(t, mounted, "%s: $%s=%s lies in no read-only Secret mount", what, e.Name, e.Value)
		}
		require.False(t, c.Resources.Requests.Memory().IsZero(), "%s: memory request", what)
		require.False(t, c.Resources.Limits.Memory().IsZero(), "%s: memory limit", what)
		require.False(t, c.Resources.Requests.Cpu().IsZero(), "%s: CPU request", what)
	}
}

// checkProcess checks a process's Deployment: its probes, and a grace period
// that covers the preStop pause and the router's close.
func checkProcess(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec
	require.Len(t, pod.Containers, 1, d.Name)
	c := pod.Containers[0]
	require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path, d.Name)
	require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path, d.Name)
	require.Equal(t, "/healthz", c.StartupProbe.HTTPGet.Path, d.Name)
	require.NotNil(t, c.Lifecycle.PreStop.Sleep, d.Name)
	stop := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds)*time.Second + router.CloseTimeout
	require.Greater(t, time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second, stop,
		"%s: the grace period must outlast the preStop pause and the router's close", d.Name)
	require.Equal(t, d.Spec.Template.Labels["app.kubernetes.io/component"], c.Args[0], d.Name)
}

// TestHelm_ChartLintsAndRendersOnlyObjectsTheKubernetesAPIAccepts: helm
// lint, then helm template with the default values and with the SASL_SSL
// and PgBouncer values, every object decoded strictly into its API type.
func TestHelm_ChartLintsAndRendersOnlyObjectsTheKubernetesAPIAccepts(t *testing.T) {
	t.Parallel()
	for name, values := range map[string]string{"default values": "", "SASL_SSL and PgBouncer": chartSASLValues} {
		t.Run(name, func(t *testing.T) {
			runHelm(t, withValues(values, "lint", "--strict", chartDir)...)
			kinds := map[string]int{}
			for _, obj := range renderChart(t, values) {
				kinds[obj.GetObjectKind().GroupVersionKind().Kind]++
				switch o := obj.(type) {
				case *appsv1.Deployment:
					checkProcess(t, o)
					checkPod(t, o.Name, o.Spec.Template.Spec)
				case *batchv1.Job:
					checkPod(t, o.Name, o.Spec.Template.Spec)
				case *monitoringv1.PrometheusRule:
					checkRules(t, o)
				case *monitoringv1.ServiceMonitor:
					require.Equal(t, "app.kubernetes.io/component", o.Spec.JobLabel, "job=promotion and job=catalog, as the alerts read them")
					require.Equal(t, "internal", o.Spec.Endpoints[0].Port, "/metrics is on the internal listener only")
				case *corev1.Service:
					// The public Service carries the API's port only; /metrics and
					// /admin are on the -internal one.
					want := "http"
					if strings.HasSuffix(o.Name, "-internal") {
						want = "internal"
					}
					require.Len(t, o.Spec.Ports, 1, o.Name)
					require.Equal(t, want, o.Spec.Ports[0].Name, o.Name)
				}
			}
			want := map[string]int{"Deployment": 2, "Service": 4, "PodDisruptionBudget": 2, "Job": 1, "NetworkPolicy": 3}
			if values != "" {
				want["Job"], want["ServiceMonitor"], want["PrometheusRule"] = 4, 2, 1
			}
			require.Equal(t, want, kinds)
		})
	}
}

// checkRules wants the PrometheusRule's groups to be deploy/prometheus/alerts.yml's.
func checkRules(t *testing.T, rule *monitoringv1.PrometheusRule) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Clean(chartAlertsRules))
	require.NoError(t, err)
	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	require.NoError(t, yaml.UnmarshalStrict(raw, &file))
	require.NotEmpty(t, file.Groups)
	require.Equal(t, file.Groups, rule.Spec.Groups)
}

// requireChartIsTheRelease checks that the chart's version and appVersion
// (the image tag it deploys by default) are release.
func requireChartIsTheRelease(t *testing.T, release string) {
	t.Helper()
	b, err := os.ReadFile(chartDir + "/Chart.yaml")
	require.NoError(t, err)
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	require.NoError(t, yaml.Unmarshal(b, &chart), "Chart.yaml")
	require.Equal(t, release, chart.Version, "Chart.yaml's version differs from the VERSION file: change both")
	require.Equal(t, release, chart.AppVersion, "Chart.yaml's appVersion differs from the VERSION file: change both")
}

// TestHelm_MigrationsRunInAHookJobBeforeTheProcesses: helm install and helm
// upgrade run `promoflow migrate up` as a pre-install,pre-upgrade hook Job,
// on the direct URL when one is set, before any pod of the release starts;
// the processes themselves never migrate.
func TestHelm_MigrationsRunInAHookJobBeforeTheProcesses(t *testing.T) {
	t.Parallel()
	for name, values := range map[string]string{"default values": "", "SASL_SSL and PgBouncer": chartSASLValues} {
		t.Run(name, func(t *testing.T) {
			var migrate *batchv1.Job
			deployments := 0
			for _, obj := range renderChart(t, values) {
				switch o := obj.(type) {
				case *batchv1.Job:
					if o.Spec.Template.Spec.Containers[0].Args[0] == "migrate" {
						require.Nil(t, migrate, "one migrate Job")
						migrate = o
					}
				case *appsv1.Deployment:
					deployments++
					env := map[string]string{}
					for _, e := range o.Spec.Template.Spec.Containers[0].Env {
						env[e.Name] = e.Value
					}
					require.Equal(t, "false", env["MIGRATE_ON_START"], "%s migrates at start", o.Name)
				}
			}
			require.Equal(t, 2, deployments)
			require.NotNil(t, migrate, "no Job runs promoflow migrate")
			require.Equal(t, []string{"migrate", "up"}, migrate.Spec.Template.Spec.Containers[0].Args)
			require.Equal(t, "pre-install,pre-upgrade", migrate.Annotations["helm.sh/hook"])
			require.Contains(t, migrate.Annotations["helm.sh/hook-delete-policy"], "before-hook-creation",
				"a hook Job of the revision before does not block this one")
			env := map[string]bool{}
			for _, e := range migrate.Spec.Template.Spec.Containers[0].Env {
				env[e.Name] = true
			}
			require.True(t, env["DATABASE_URL"])
			require.Equal(t, values != "", env["DATABASE_DIRECT_URL"], "migrations run on the server itself behind PgBouncer")
		})
	}
}
