package main

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/promoflow/promoflow/app/api"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/dlqreplay"
)

// compose.yaml cannot be run on machines without Docker; this test checks it
// statically against the product: commands, settings, files and ports.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       map[string]string `yaml:"build"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		Volumes     []string          `yaml:"volumes"`
		DependsOn   yaml.Node         `yaml:"depends_on"`
	} `yaml:"services"`
}

func loadCompose(t *testing.T) composeFile {
	raw, err := os.ReadFile("../compose.yaml")
	require.NoError(t, err)
	var c composeFile
	require.NoError(t, yaml.Unmarshal(raw, &c))
	return c
}

func knownEnv(register func(*settings)) map[string]bool {
	s := newSettings("x", "")
	register(s)
	out := map[string]bool{}
	for _, env := range s.envs {
		out[env] = true
	}
	return out
}

// composeBrokers are the Kafka brokers of compose.yaml, as KAFKA_BROKERS names them.
const composeBrokers = "kafka-1:9092,kafka-2:9092,kafka-3:9092"

// TestCompose_DescribesTheWholeStack: PostgreSQL, Kafka as three brokers
// beside a quorum of three KRaft controllers (one cluster id), both
// processes, Prometheus, Grafana; every internal topic with three replicas,
// two in sync for a write.
func TestCompose_DescribesTheWholeStack(t *testing.T) {
	c := loadCompose(t)
	for _, name := range []string{"postgres", "promotion", "catalog", "prometheus", "grafana"} {
		require.Contains(t, c.Services, name)
	}
	const voters = "101@kafka-controller-1:9093,102@kafka-controller-2:9093,103@kafka-controller-3:9093"
	var clusterID string
	for i := 1; i <= 3; i++ {
		for _, svc := range []struct{ name, roles, id string }{
			{fmt.Sprintf("kafka-controller-%d", i), "controller", fmt.Sprint(100 + i)},
			{fmt.Sprintf("kafka-%d", i), "broker", fmt.Sprint(i)},
		} {
			require.Contains(t, c.Services, svc.name)
			env := c.Services[svc.name].Environment
			require.True(t, strings.HasPrefix(c.Services[svc.name].Image, "apache/kafka:4."), "%s: Apache Kafka 4.x", svc.name)
			require.Equal(t, svc.roles, env["KAFKA_PROCESS_ROLES"], svc.name)
			require.Equal(t, svc.id, env["KAFKA_NODE_ID"], svc.name)
			require.Equal(t, voters, env["KAFKA_CONTROLLER_QUORUM_VOTERS"], svc.name)
			clusterID = cmp.Or(clusterID, env["CLUSTER_ID"])
			require.Equal(t, clusterID, env["CLUSTER_ID"], "%s: one cluster", svc.name)
		}
		broker := c.Services[fmt.Sprintf("kafka-%d", i)].Environment
		require.Equal(t, fmt.Sprintf("PLAINTEXT://kafka-%d:9092", i), broker["KAFKA_ADVERTISED_LISTENERS"])
		for k, v := range broker {
			if strings.HasSuffix(k, "REPLICATION_FACTOR") {
				require.Equal(t, "3", v, k)
			}
			if strings.HasSuffix(k, "MIN_ISR") || k == "KAFKA_MIN_INSYNC_REPLICAS" {
				require.Equal(t, "2", v, k)
			}
		}
	}
	require.NotEmpty(t, clusterID)
}

func TestCompose_ProcessesUseKnownCommandsAndSettings(t *testing.T) {
	c := loadCompose(t)
	envs := map[string]map[string]bool{
		"promotion": knownEnv(func(s *settings) { (&promotionConfig{}).register(s) }),
		"catalog":   knownEnv(func(s *settings) { (&catalogConfig{}).register(s) }),
	}
	for name, known := range envs {
		svc := c.Services[name]
		require.Equal(t, []string{name}, svc.Command)
		require.FileExists(t, filepath.Join("..", svc.Build["context"], svc.Build["dockerfile"]))
		for k := range svc.Environment {
			require.True(t, known[k], "%s: %s is not a setting of promoflow %s", name, k, name)
		}
		require.Contains(t, svc.Environment["DATABASE_URL"], "@postgres:5432/")
		require.Equal(t, composeBrokers, svc.Environment["KAFKA_BROKERS"])
		port := strings.TrimPrefix(svc.Environment["HTTP_ADDR"], ":")
		require.Contains(t, svc.Ports, port+":"+port)
	}
	_, err := parseTokensEnv(c.Services["promotion"].Environment["PROMOTION_API_TOKENS"])
	require.NoError(t, err)
}

func TestCompose_MountedFilesExistAndPrometheusScrapesBothProcesses(t *testing.T) {
	c := loadCompose(t)
	for name, svc := range c.Services {
		for _, v := range svc.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, "./") {
				_, err := os.Stat(filepath.Join("..", src))
				require.NoError(t, err, "%s mounts %s", name, src)
			}
		}
	}
	raw, err := os.ReadFile("../deploy/prometheus/prometheus.yml")
	require.NoError(t, err)
	require.Contains(t, string(raw), `"promotion:8080"`)
	require.Contains(t, string(raw), `"catalog:8081"`)
}

// TestCompose_PurchaseTopicIsACompactedChangelog: the topics service makes the
// purchase topic compacted before either process starts, and the DLQ and
// replay topics with the default retention, under the names the product uses.
func TestCompose_PurchaseTopicIsACompactedChangelog(t *testing.T) {
	c := loadCompose(t)
	topics := c.Services["kafka-topics"]
	require.True(t, strings.HasPrefix(topics.Image, "apache/kafka:4."))
	script := strings.Join(topics.Command, " ")
	require.Contains(t, script, "--bootstrap-server "+composeBrokers)
	partitions := fmt.Sprintf(" --partitions %d --replication-factor 3 --config min.insync.replicas=2", topicPartitionsDefault)
	require.Contains(t, script, "--topic "+event.Topic+partitions+" --config cleanup.policy=compact")
	for _, topic := range []string{middleware.DLQTopicDefault, dlqreplay.ReplayTopicDefault} {
		require.Regexp(t, "--topic "+regexp.QuoteMeta(topic)+regexp.QuoteMeta(partitions)+"( &&|$)", script)
	}
	for _, name := range []string{"promotion", "catalog"} {
		var deps map[string]map[string]string
		node := c.Services[name].DependsOn
		require.NoError(t, node.Decode(&deps))
		require.Equal(t, "service_completed_successfully", deps["kafka-topics"]["condition"], name)
	}
}

// TestCompose_ShowsTheKafkaSecuritySettingsWithSecretsAsFiles: the commented
// production settings are settings of promoflow, the password comes from a
// file under /run/secrets, and no password is written in the file.
func TestCompose_ShowsTheKafkaSecuritySettingsWithSecretsAsFiles(t *testing.T) {
	raw, err := os.ReadFile("../compose.yaml")
	require.NoError(t, err)
	known := knownEnv(func(s *settings) { (&promotionConfig{}).register(s) })
	commented := regexp.MustCompile(`(?m)^\s*#\s*(KAFKA_[A-Z_]+):\s*(\S+)`).FindAllStringSubmatch(string(raw), -1)
	shown := map[string]string{}
	for _, m := range commented {
		require.True(t, known[m[1]], "compose.yaml shows %s, which is not a setting", m[1])
		shown[m[1]] = m[2]
	}
	for _, name := range []string{"KAFKA_TLS", "KAFKA_TLS_CA_FILE", "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE",
		"KAFKA_TLS_SERVER_NAME", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD_FILE"} {
		require.Contains(t, shown, name)
	}
	require.NotContains(t, shown, "KAFKA_SASL_PASSWORD", "the password comes from a file")
	for _, file := range []string{"KAFKA_SASL_PASSWORD_FILE", "KAFKA_TLS_CA_FILE", "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE"} {
		require.True(t, strings.HasPrefix(shown[file], "/run/secrets/"), "%s is a mounted secret", file)
		secret := strings.TrimPrefix(shown[file], "/run/secrets/")
		require.Regexp(t, `(?m)^#\s+`+regexp.QuoteMeta(secret)+`:\n#\s+file: \./secrets/`, string(raw), "the secret %s is declared", secret)
	}
}

func parseTokensEnv(s string) (int, error) {
	tokens, err := api.ParseTokens(s)
	return len(tokens), err
}

// TestCompose_CommentedSettingsAreSettings: every production setting that
// compose.yaml shows commented out is read by a promoflow process.
func TestCompose_CommentedSettingsAreSettings(t *testing.T) {
	raw, err := os.ReadFile("../compose.yaml")
	require.NoError(t, err)
	known := map[string]bool{}
	for _, register := range []func(*settings){(&promotionConfig{}).register, (&catalogConfig{}).register} {
		for env := range knownEnv(register) {
			known[env] = true
		}
	}
	commented := regexp.MustCompile(`(?m)^\s*# ([A-Z][A-Z0-9_]+): `).FindAllStringSubmatch(string(raw), -1)
	require.NotEmpty(t, commented)
	for _, m := range commented {
		require.True(t, known[m[1]], "compose.yaml shows %s, which no promoflow process reads", m[1])
	}
}
