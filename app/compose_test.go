package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/api"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/dlqreplay"
)

// compose.yaml cannot be run on machines without Docker. These tests load it
// with the Compose Specification's own loader (compose-go, which validates it
// against the specification's schema, resolves the anchors and merges, and
// needs no Docker engine) and check the model against the product.
const composeFile = "../compose.yaml"

func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	abs, err := filepath.Abs(composeFile)
	require.NoError(t, err)
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs}},
		Environment: types.Mapping{}, // the test's own environment interpolates nothing
	}, func(o *loader.Options) { o.SetProjectName("promoflow", true) })
	require.NoError(t, err, "the Compose loader refuses compose.yaml")
	return p
}

// processes are the compose services that run promoflow, with their settings.
var processes = map[string]func(*settings){
	"promotion": func(s *settings) { (&promotionConfig{}).register(s) },
	"catalog":   func(s *settings) { (&catalogConfig{}).register(s) },
}

// composeSetsOnPurpose are the settings compose.yaml gives a value other
// than the code's default; every other setting it lists holds the default.
var composeSetsOnPurpose = []string{"DATABASE_URL", "KAFKA_BROKERS", "KAFKA_TOPIC_REPLICATION", "HTTP_ADDR", "ADMIN_ADDR", "PROMOTION_API_TOKENS", "CATALOG_ADMIN_TOKEN", "CATALOG_FEED_TOKEN"}

// secretFromFile is the one setting compose.yaml never shows: the password
// comes from KAFKA_SASL_PASSWORD_FILE.
const secretFromFile = "KAFKA_SASL_PASSWORD"

// composeBrokers are the Kafka brokers of compose.yaml, as KAFKA_BROKERS names them.
const composeBrokers = "kafka-1:9092,kafka-2:9092,kafka-3:9092"

// kafkaNodes are the compose services of the Kafka cluster: three KRaft
// controllers beside three brokers.
var kafkaNodes = []string{"kafka-controller-1", "kafka-controller-2", "kafka-controller-3", "kafka-1", "kafka-2", "kafka-3"}

// TestCompose_DescribesTheWholeStack: PostgreSQL, Kafka as three brokers
// beside a quorum of three KRaft controllers (one cluster id), both
// processes, Prometheus, Grafana; every internal topic with three replicas,
// two in sync for a write.
func TestCompose_DescribesTheWholeStack(t *testing.T) {
	p := loadCompose(t)
	require.ElementsMatch(t, append([]string{"postgres", "migrate", "kafka-topics", "promotion", "catalog", "prometheus", "grafana", "jaeger"}, kafkaNodes...), p.ServiceNames())
	const voters = "101@kafka-controller-1:9093,102@kafka-controller-2:9093,103@kafka-controller-3:9093"
	clusterID := env(t, p.Services["kafka-1"], "CLUSTER_ID")
	require.NotEmpty(t, clusterID)
	for i, name := range kafkaNodes {
		svc := p.Services[name]
		broker := i >= 3
		require.True(t, strings.HasPrefix(svc.Image, "apache/kafka:4."), "%s: Apache Kafka 4.x", name)
		require.Equal(t, map[bool]string{false: "controller", true: "broker"}[broker], env(t, svc, "KAFKA_PROCESS_ROLES"), name)
		require.Equal(t, map[bool]string{false: fmt.Sprint(101 + i), true: fmt.Sprint(i - 2)}[broker], env(t, svc, "KAFKA_NODE_ID"), name)
		require.Equal(t, voters, env(t, svc, "KAFKA_CONTROLLER_QUORUM_VOTERS"), name)
		require.Equal(t, clusterID, env(t, svc, "CLUSTER_ID"), "%s: one cluster", name)
		if !broker {
			continue
		}
		require.Equal(t, "PLAINTEXT://"+name+":9092", env(t, svc, "KAFKA_ADVERTISED_LISTENERS"))
		for k := range svc.Environment {
			if strings.HasSuffix(k, "REPLICATION_FACTOR") {
				require.Equal(t, "3", env(t, svc, k), "%s %s", name, k)
			}
			if strings.HasSuffix(k, "MIN_ISR") || k == "KAFKA_MIN_INSYNC_REPLICAS" {
				require.Equal(t, "2", env(t, svc, k), "%s %s", name, k)
			}
		}
	}
	require.Equal(t, "promoflow", env(t, p.Services["postgres"], "POSTGRES_DB"))

	// Ports: the APIs, Prometheus, Grafana and PostgreSQL, each on the host's same port, on loopback.
	for name, port := range map[string]uint32{"postgres": 5432, "promotion": 8080, "catalog": 8081,
		"prometheus": 9090, "grafana": 3000, "jaeger": 16686} {
		require.Contains(t, p.Services[name].Ports, types.ServicePortConfig{Mode: "ingress", Protocol: "tcp",
			HostIP: "127.0.0.1", Target: port, Published: strconv.Itoa(int(port))}, "%s publishes %d", name, port)
	}
}

// TestCompose_PublishesEveryPortOnLoopbackOnly: the stack has well-known
// credentials (PostgreSQL's password, the demo tokens, Grafana's admin), so
// no port is reachable from beyond the machine that runs it.
func TestCompose_PublishesEveryPortOnLoopbackOnly(t *testing.T) {
	p := loadCompose(t)
	published := 0
	for _, name := range p.ServiceNames() {
		for _, port := range p.Services[name].Ports {
			published++
			require.Equal(t, "127.0.0.1", port.HostIP,
				"%s publishes %d on every interface: write it \"127.0.0.1:%s:%d\"", name, port.Target, port.Published, port.Target)
		}
	}
	require.NotZero(t, published, "compose.yaml publishes no port")
}

// TestCompose_StartsEachServiceAfterWhatItNeeds: the dependencies and their
// conditions, and a health check on every service another one waits to be
// healthy.
func TestCompose_StartsEachServiceAfterWhatItNeeds(t *testing.T) {
	p := loadCompose(t)
	want := map[string]map[string]string{
		"kafka-topics": {"kafka-1": types.ServiceConditionHealthy, "kafka-2": types.ServiceConditionHealthy, "kafka-3": types.ServiceConditionHealthy},
		"kafka-1":      {"kafka-controller-1": types.ServiceConditionStarted, "kafka-controller-2": types.ServiceConditionStarted, "kafka-controller-3": types.ServiceConditionStarted},
		"kafka-2":      {"kafka-controller-1": types.ServiceConditionStarted, "kafka-controller-2": types.ServiceConditionStarted, "kafka-controller-3": types.ServiceConditionStarted},
		"kafka-3":      {"kafka-controller-1": types.ServiceConditionStarted, "kafka-controller-2": types.ServiceConditionStarted, "kafka-controller-3": types.ServiceConditionStarted},
		"migrate":      {"postgres": types.ServiceConditionHealthy},
		"promotion": {"postgres": types.ServiceConditionHealthy, "migrate": types.ServiceConditionCompletedSuccessfully,
			"kafka-topics": types.ServiceConditionCompletedSuccessfully},
		"catalog": {"postgres": types.ServiceConditionHealthy, "migrate": types.ServiceConditionCompletedSuccessfully,
			"kafka-topics": types.ServiceConditionCompletedSuccessfully, "promotion": types.ServiceConditionStarted},
		"prometheus": {"promotion": types.ServiceConditionStarted, "catalog": types.ServiceConditionStarted},
		"grafana":    {"prometheus": types.ServiceConditionStarted, "jaeger": types.ServiceConditionStarted},
	}
	for _, name := range p.ServiceNames() {
		got := map[string]string{}
		for dep, d := range p.Services[name].DependsOn {
			got[dep] = d.Condition
			if d.Condition == types.ServiceConditionHealthy {
				hc := p.Services[dep].HealthCheck
				require.True(t, hc != nil && !hc.Disable && len(hc.Test) > 1, "%s waits for %s to be healthy, which has no health check", name, dep)
			}
		}
		if want[name] == nil {
			require.Empty(t, got, name)
			continue
		}
		require.Equal(t, want[name], got, "%s depends on", name)
	}
	// The processes never migrate: the migrate service does, on their database, first.
	migrate := p.Services["migrate"]
	require.Equal(t, types.ShellCommand{"migrate", "up"}, migrate.Command)
	require.Equal(t, p.Services["promotion"].Build, migrate.Build, "the processes' image")
	for _, name := range []string{"promotion", "catalog"} {
		require.Equal(t, env(t, p.Services[name], "DATABASE_URL"), env(t, migrate, "DATABASE_URL"), name)
		require.Equal(t, "false", env(t, p.Services[name], "MIGRATE_ON_START"), name)
	}
	require.Equal(t, types.HealthCheckTest{"CMD", "pg_isready", "-U", "promoflow", "-d", "promoflow"}, p.Services["postgres"].HealthCheck.Test)
	for _, name := range kafkaNodes[3:] {
		require.Contains(t, strings.Join(p.Services[name].HealthCheck.Test, " "), "--bootstrap-server localhost:9092", name)
	}
}

// TestCompose_ProcessesReadEverySettingWithItsDefault: a promoflow service
// runs its command from the Dockerfile; it lists every setting the process
// reads (or shows it commented out, for the Kafka security ones), and none
// it does not; each value is one the process takes, the code's default
// unless compose.yaml means another (composeSetsOnPurpose). A new setting
// fails this test until compose.yaml lists it.
func TestCompose_ProcessesReadEverySettingWithItsDefault(t *testing.T) {
	p := loadCompose(t)
	commented := commentedSettings(t)
	for name, register := range processes {
		svc := p.Services[name]
		require.Equal(t, types.ShellCommand{name}, svc.Command)
		require.FileExists(t, filepath.Join(svc.Build.Context, svc.Build.Dockerfile))

		s := newSettings(name, "")
		register(s)
		known := map[string]string{} // env var → flag
		for flagName, envName := range s.envs {
			known[envName] = flagName
		}
		for envName, value := range svc.Environment {
			if strings.HasPrefix(envName, "OTEL_") {
				continue // the OpenTelemetry SDK's (TestCompose_ProcessesExportTracesToTheCollector)
			}
			flagName, ok := known[envName]
			require.True(t, ok, "%s: %s is not a setting of promoflow %s", name, envName, name)
			require.NotNil(t, value, "%s: %s has no value", name, envName)
			require.NoError(t, s.fs.Set(flagName, *value), "%s: %s=%q", name, envName, *value)
			if !slices.Contains(composeSetsOnPurpose, envName) {
				f := s.fs.Lookup(flagName)
				require.Equal(t, f.DefValue, f.Value.String(), "%s: %s is not the code's default", name, envName)
			}
		}
		for envName := range known {
			_, listed := svc.Environment[envName]
			require.True(t, listed || commented[envName] != "" || envName == secretFromFile,
				"%s: compose.yaml does not list setting %s", name, envName)
		}
	}

	promotion, catalog := p.Services["promotion"], p.Services["catalog"]
	for _, svc := range []types.ServiceConfig{promotion, catalog} {
		require.Contains(t, env(t, svc, "DATABASE_URL"), "@postgres:5432/")
		require.Equal(t, composeBrokers, env(t, svc, "KAFKA_BROKERS"))
	}
	require.Equal(t, ":8080", env(t, promotion, "HTTP_ADDR"))
	require.Equal(t, ":8081", env(t, catalog, "HTTP_ADDR"))
	tokens, err := api.ParseTokens(env(t, promotion, "PROMOTION_API_TOKENS"), api.MinTokenLength)
	require.NoError(t, err)
	require.NotEmpty(t, tokens)
}

// TestCompose_ProcessesExportTracesToTheCollector: both processes export
// their spans over OTLP/HTTP to the jaeger service, which takes them on 4318,
// and Grafana has it as a data source for its panels' trace links.
func TestCompose_ProcessesExportTracesToTheCollector(t *testing.T) {
	p := loadCompose(t)
	for _, name := range []string{"promotion", "catalog"} {
		require.Equal(t, "http://jaeger:4318", env(t, p.Services[name], "OTEL_EXPORTER_OTLP_ENDPOINT"), name)
	}
	require.True(t, strings.HasPrefix(p.Services["jaeger"].Image, "jaegertracing/jaeger:2."), "Jaeger v2 (OTLP)")
	require.Contains(t, p.Services["jaeger"].Ports, types.ServicePortConfig{Mode: "ingress", Protocol: "tcp",
		HostIP: "127.0.0.1", Target: 4318, Published: "4318"})
	raw, err := os.ReadFile("../deploy/grafana/provisioning/datasources/jaeger.yml")
	require.NoError(t, err)
	require.Contains(t, string(raw), "url: http://jaeger:16686")
}

func TestCompose_MountedFilesExistAndPrometheusScrapesBothProcesses(t *testing.T) {
	p := loadCompose(t)
	for _, name := range p.ServiceNames() {
		for _, v := range p.Services[name].Volumes {
			if v.Type == types.VolumeTypeBind {
				_, err := os.Stat(v.Source)
				require.NoError(t, err, "%s mounts %s", name, v.Source)
			}
		}
	}
	raw, err := os.ReadFile("../deploy/prometheus/prometheus.yml")
	require.NoError(t, err)
	// On each process's internal listener (ADMIN_ADDR), where /metrics is.
	require.Contains(t, string(raw), `"promotion:`+strings.TrimPrefix(env(t, p.Services["promotion"], "ADMIN_ADDR"), ":")+`"`)
	require.Contains(t, string(raw), `"catalog:`+strings.TrimPrefix(env(t, p.Services["catalog"], "ADMIN_ADDR"), ":")+`"`)
}

// TestCompose_PurchaseTopicIsACompactedChangelog: the topics service makes the
// purchase topic compacted before either process starts, and the DLQ and
// replay topics with the default retention, under the names the product uses.
func TestCompose_PurchaseTopicIsACompactedChangelog(t *testing.T) {
	topics := loadCompose(t).Services["kafka-topics"]
	require.True(t, strings.HasPrefix(topics.Image, "apache/kafka:4."))
	script := strings.Join(topics.Command, " ")
	partitions := fmt.Sprintf(" --partitions %d --replication-factor 3 --config min.insync.replicas=2", topicPartitionsDefault)
	require.Contains(t, script, "--topic "+event.Topic+partitions+" --config cleanup.policy=compact")
	for _, topic := range []string{middleware.DLQTopicDefault, dlqreplay.ReplayTopicDefault} {
		require.Regexp(t, "--topic "+regexp.QuoteMeta(topic)+regexp.QuoteMeta(partitions)+"( &&|$)", script)
	}
}

// TestCompose_ShowsTheKafkaSecuritySettingsWithSecretsAsFiles: the commented
// production settings are settings of promoflow, the password comes from a
// file under /run/secrets, and no password is written in the file. (The
// loader drops comments, so these are read as text.)
func TestCompose_ShowsTheKafkaSecuritySettingsWithSecretsAsFiles(t *testing.T) {
	raw, err := os.ReadFile(composeFile)
	require.NoError(t, err)
	shown := commentedSettings(t)
	known := map[string]bool{}
	for _, register := range processes {
		s := newSettings("x", "")
		register(s)
		for _, envName := range s.envs {
			known[envName] = true
		}
	}
	for name := range shown {
		require.True(t, known[name], "compose.yaml shows %s, which is not a setting", name)
	}
	for _, name := range []string{"KAFKA_TLS", "KAFKA_TLS_CA_FILE", "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE",
		"KAFKA_TLS_SERVER_NAME", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD_FILE",
		"DATABASE_DIRECT_URL", "DATABASE_PREPARED_STATEMENTS"} {
		require.Contains(t, shown, name)
	}
	require.NotContains(t, shown, secretFromFile, "the password comes from a file")
	for _, file := range []string{"KAFKA_SASL_PASSWORD_FILE", "KAFKA_TLS_CA_FILE", "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE"} {
		require.True(t, strings.HasPrefix(shown[file], "/run/secrets/"), "%s is a mounted secret", file)
		secret := strings.TrimPrefix(shown[file], "/run/secrets/")
		require.Regexp(t, `(?m)^#\s+`+regexp.QuoteMeta(secret)+`:\n#\s+file: \./secrets/`, string(raw), "the secret %s is declared", secret)
	}
}

// commentedSettings are the settings compose.yaml shows commented out, with
// the value it shows.
func commentedSettings(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(composeFile)
	require.NoError(t, err)
	shown := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s*#\s*([A-Z][A-Z0-9_]+):\s*(\S+)`).FindAllStringSubmatch(string(raw), -1) {
		shown[m[1]] = strings.Trim(m[2], `"`)
	}
	return shown
}

func env(t *testing.T, svc types.ServiceConfig, name string) string {
	t.Helper()
	v, ok := svc.Environment[name]
	require.True(t, ok && v != nil, "%s has no %s", svc.Name, name)
	return *v
}
