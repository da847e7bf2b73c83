package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// failFastLimit is how soon a command must end when the brokers refuse its
// settings: it ends by itself within it, or the test fails.
const failFastLimit = 30 * time.Second

// secure is the package's SecureBroker: started by the first test that needs
// it, stopped by TestMain.
var secure struct {
	once   sync.Once
	dir    string
	broker *kafkatest.SecureBroker
	err    error
}

func secureBroker(t *testing.T) *kafkatest.SecureBroker {
	t.Helper()
	secure.once.Do(func() {
		secure.dir, secure.err = os.MkdirTemp("", "promoflow-secure-kafka-")
		if secure.err == nil {
			secure.broker, secure.err = kafkatest.StartSecureBroker(secure.dir)
		}
	})
	require.NoError(t, secure.err, "secure kafka broker")
	return secure.broker
}

func stopSecureBroker() {
	if secure.broker != nil {
		secure.broker.Stop()
	}
	if secure.dir != "" {
		_ = os.RemoveAll(secure.dir)
	}
}

// saslEnv are the settings of a client of the SASL_SSL listener.
func saslEnv(b *kafkatest.SecureBroker, mechanism string) map[string]string {
	return map[string]string{
		"KAFKA_BROKERS": b.SASLSSL, "KAFKA_TLS": "true", "KAFKA_TLS_CA_FILE": b.Certs.CAFile,
		"KAFKA_SASL_MECHANISM": mechanism, "KAFKA_SASL_USERNAME": b.User, "KAFKA_SASL_PASSWORD": b.Password,
	}
}

// mutualTLSEnv are the settings of a client of the SSL listener, which
// requires client certificates.
func mutualTLSEnv(b *kafkatest.SecureBroker) map[string]string {
	return map[string]string{
		"KAFKA_BROKERS": b.MutualTLS, "KAFKA_TLS": "true", "KAFKA_TLS_CA_FILE": b.Certs.CAFile,
		"KAFKA_TLS_CERT_FILE": b.Certs.ClientCertFile, "KAFKA_TLS_KEY_FILE": b.Certs.ClientKeyFile,
	}
}

func with(env map[string]string, kv ...string) map[string]string {
	out := maps.Clone(env)
	if out == nil {
		out = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(out, kv[i])
		} else {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}

const (
	pipelineToken  = "secure-tenant-token"
	pipelineTenant = "6a1f0c52-8d3e-4b7a-9c21-0e5f4d3b2a19"
	pipelineAdmin  = "secure-admin-token"
)

// pipeline is a promotion and a catalog process on topics of their own.
type pipeline struct {
	promotion, catalog         *command
	promotionAddr, catalogAddr string
	topic, dlqTopic            string
	env                        map[string]string // what both share: database, kafka, topics
}

// startPipeline starts both processes with the given Kafka settings (and
// catalogKV, setting pairs of the catalog alone) and waits until both are ready.
func startPipeline(t *testing.T, kafkaEnv map[string]string, catalogKV ...string) *pipeline {
	t.Helper()
	suffix := kafkatest.RandomSuffix()
	p := &pipeline{promotionAddr: freeAddr(t), catalogAddr: freeAddr(t),
		topic: "pf-secure-" + suffix, dlqTopic: "pf-secure-dlq-" + suffix}
	p.env = with(kafkaEnv, "DATABASE_URL", migratedDatabaseURL(t), "PROMOTION_TOPIC", p.topic,
		"CATALOG_DLQ_TOPIC", p.dlqTopic, "CATALOG_REPLAY_TOPIC", "pf-secure-replay-"+suffix,
		"CATALOG_CONSUMER_GROUP", "pf-secure-"+suffix, "KAFKA_TOPIC_PARTITIONS", "2", "LOG_LEVEL", "debug")
	catalog := with(p.env, append([]string{"HTTP_ADDR", p.catalogAddr, "CATALOG_ADMIN_TOKEN", pipelineAdmin}, catalogKV...)...)
	p.catalog = startCommand(t, catalog, "catalog")
	p.promotion = startCommand(t, with(p.env, "HTTP_ADDR", p.promotionAddr,
		"PROMOTION_API_TOKENS", pipelineToken+"="+pipelineTenant), "promotion")
	p.catalog.waitReady(t, p.catalogAddr)
	p.promotion.waitReady(t, p.promotionAddr)
	return p
}

// purchaseReachesItsCard feeds a project card to the catalog, buys a
// promotion of it through the purchase API, and waits for the card's boost:
// API → outbox → relay → Kafka → consumer → card.
func (p *pipeline) purchaseReachesItsCard(t *testing.T) {
	t.Helper()
	project := uuid.New()
	status, body := call(t, "PUT", "http://"+p.catalogAddr+"/cards/projects/"+project.String(), pipelineAdmin, `{"Title":"Secure","Visibility":"Public"}`)
	require.Equal(t, http.StatusOK, status, body)
	purchase := fmt.Sprintf(`{"PackageKind":"Top","BoostWeight":7,"EndsAt":%q,"Targets":[{"TargetKind":"Project","TargetId":%q}]}`,
		time.Now().Add(time.Hour).UTC().Format(time.RFC3339), project)
	status, body = call(t, "POST", "http://"+p.promotionAddr+"/promotions", pipelineToken, purchase)
	require.Equal(t, http.StatusCreated, status, body)
	require.Eventually(t, func() bool {
		status, body := call(t, "GET", "http://"+p.catalogAddr+"/cards/projects/"+project.String(), "", "")
		var card struct{ PromotionBoost int }
		return status == http.StatusOK && json.Unmarshal([]byte(body), &card) == nil && card.PromotionBoost == 7
	}, 60*time.Second, 100*time.Millisecond, "the card never got the purchase's boost; catalog output:\n%s", p.catalog)
}

func call(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// requireRefused runs `promoflow promotion` with settings the brokers refuse:
// it must end by itself within failFastLimit, exit 78, name the cause and
// never have listened (so never reported ready).
func requireRefused(t *testing.T, env map[string]string, cause string, args ...string) string {
	t.Helper()
	env = with(env, "DATABASE_URL", migratedDatabaseURL(t), "HTTP_ADDR", freeAddr(t),
		"PROMOTION_TOPIC", "pf-secure-"+kafkatest.RandomSuffix())
	if len(args) == 0 {
		args = []string{"promotion"}
	}
	code, out := runCommand(t, env, failFastLimit, args...)
	require.Equal(t, exitKafkaRefused, code, "exit status; output:\n%s", out)
	require.Contains(t, out, cause, "the message names the cause")
	require.NotContains(t, out, "http listening", "a refused process never serves /readyz")
	t.Logf("promoflow %s printed:\n%s", strings.Join(args, " "), lastLines(out, 2))
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestKafkaSecurity_ScramOverTLSCarriesThePipeline: both processes reach a
// SASL_SSL listener with SCRAM-SHA-512 from the KAFKA_* settings alone, and a
// purchase made through the API reaches its card.
func TestKafkaSecurity_ScramOverTLSCarriesThePipeline(t *testing.T) {
	t.Parallel()
	p := startPipeline(t, saslEnv(secureBroker(t), kafkakit.MechanismSCRAMSHA512))
	p.purchaseReachesItsCard(t)
	require.Contains(t, p.promotion.output(), `"protocol":"SASL_SSL","saslMechanism":"SCRAM-SHA-512"`)
}

// TestKafkaSecurity_PlainOverTLSCarriesThePipeline: the same with SASL PLAIN
// over TLS, the shape of Confluent Cloud.
func TestKafkaSecurity_PlainOverTLSCarriesThePipeline(t *testing.T) {
	t.Parallel()
	p := startPipeline(t, saslEnv(secureBroker(t), kafkakit.MechanismPlain))
	p.purchaseReachesItsCard(t)
	require.Contains(t, p.catalog.output(), `"protocol":"SASL_SSL","saslMechanism":"PLAIN"`)
}

// TestKafkaSecurity_MutualTLS: a listener that requires client certificates
// carries the pipeline for clients that have one, and refuses at start a
// client that has none.
func TestKafkaSecurity_MutualTLS(t *testing.T) {
	t.Parallel()
	b := secureBroker(t)
	p := startPipeline(t, mutualTLSEnv(b))
	p.purchaseReachesItsCard(t)
	require.Contains(t, p.promotion.output(), `"protocol":"SSL","clientCertificate":true`)

	requireRefused(t, with(mutualTLSEnv(b), "KAFKA_TLS_CERT_FILE", "", "KAFKA_TLS_KEY_FILE", ""),
		"authentication failed: the brokers require a client certificate (mutual TLS) and none is configured")
}

// TestKafkaSecurity_WrongPasswordFailsFastWithAClearError: a wrong password
// ends the promotion and the catalog process at start, exit 78, with
// "authentication failed".
func TestKafkaSecurity_WrongPasswordFailsFastWithAClearError(t *testing.T) {
	t.Parallel()
	b := secureBroker(t)
	for _, mechanism := range kafkakit.Mechanisms {
		for _, command := range []string{"promotion", "catalog"} {
			t.Run(mechanism+"/"+command, func(t *testing.T) {
				t.Parallel()
				wrong := "wrong-" + kafkatest.RandomSuffix()
				out := requireRefused(t, with(saslEnv(b, mechanism), "KAFKA_SASL_PASSWORD", wrong),
					"authentication failed: the brokers refused the "+mechanism+" credentials of user \""+b.User+"\"", command)
				require.NotContains(t, out, wrong)
			})
		}
	}
}

// TestKafkaSecurity_UntrustedCertificateIsRefused: a broker certificate that
// the configured CA did not sign, or that does not hold KAFKA_TLS_SERVER_NAME,
// ends the process ("certificate not trusted"), and so does a client
// certificate of a CA the broker does not trust.
func TestKafkaSecurity_UntrustedCertificateIsRefused(t *testing.T) {
	t.Parallel()
	b := secureBroker(t)
	t.Run("broker certificate", func(t *testing.T) {
		t.Parallel()
		requireRefused(t, with(saslEnv(b, kafkakit.MechanismSCRAMSHA512), "KAFKA_TLS_CA_FILE", b.Certs.UntrustedCAFile),
			"certificate not trusted: the brokers' certificate does not verify against the CA file "+b.Certs.UntrustedCAFile+": x509: certificate signed by unknown authority")
	})
	t.Run("a name the broker certificate does not hold", func(t *testing.T) {
		t.Parallel()
		requireRefused(t, with(saslEnv(b, kafkakit.MechanismSCRAMSHA512), "KAFKA_TLS_SERVER_NAME", "kafka.example.org"),
			"certificate not trusted: the brokers' certificate does not hold the name the client checks: x509: certificate is valid for localhost, not kafka.example.org")
	})
	t.Run("client certificate", func(t *testing.T) {
		t.Parallel()
		requireRefused(t, with(mutualTLSEnv(b), "KAFKA_TLS_CERT_FILE", b.Certs.UntrustedCertFile, "KAFKA_TLS_KEY_FILE", b.Certs.UntrustedKeyFile),
			"authentication failed: the brokers refused the client certificate")
	})
	t.Run("no verification is warned about", func(t *testing.T) {
		t.Parallel()
		out := requireRefused(t, with(saslEnv(b, kafkakit.MechanismSCRAMSHA512), "KAFKA_TLS_CA_FILE", "",
			"KAFKA_TLS_INSECURE_SKIP_VERIFY", "true", "KAFKA_SASL_PASSWORD", "wrong"), "authentication failed")
		require.Contains(t, out, `"level":"WARN","msg":"KAFKA_TLS_INSECURE_SKIP_VERIFY is on`)
	})
}

// TestKafkaSecurity_ListenerOfAnotherProtocolIsNamed: a plaintext client on a
// TLS listener and a TLS client on a plaintext one end at start with "the
// listener speaks another protocol", as do SASL and its absence on the wrong
// listener.
func TestKafkaSecurity_ListenerOfAnotherProtocolIsNamed(t *testing.T) {
	t.Parallel()
	b := secureBroker(t)
	const cause = "the listener speaks another protocol: "
	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"plaintext client on the SSL listener":      {map[string]string{"KAFKA_BROKERS": b.MutualTLS}, "it speaks TLS and the client connects without TLS"},
		"SASL_PLAINTEXT client on the SASL_SSL one": {with(saslEnv(b, kafkakit.MechanismPlain), "KAFKA_TLS", "", "KAFKA_TLS_CA_FILE", ""), "it speaks TLS and the client connects without TLS"},
		"TLS client on the plaintext listener":      {map[string]string{"KAFKA_BROKERS": b.Plaintext, "KAFKA_TLS": "true", "KAFKA_TLS_CA_FILE": b.Certs.CAFile}, "it speaks plaintext and the client connects with TLS"},
		"SSL client on the SASL_SSL listener":       {with(saslEnv(b, kafkakit.MechanismPlain), "KAFKA_SASL_MECHANISM", "", "KAFKA_SASL_USERNAME", "", "KAFKA_SASL_PASSWORD", ""), "it expects SASL authentication and the client sends none"},
		"SASL client on the SSL listener":           {with(mutualTLSEnv(b), "KAFKA_SASL_MECHANISM", "PLAIN", "KAFKA_SASL_USERNAME", b.User, "KAFKA_SASL_PASSWORD", b.Password), "it takes no SASL authentication and the client authenticates with PLAIN"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			requireRefused(t, tc.env, cause+tc.want)
		})
	}
}

// kafkaCommands are the commands that talk to Kafka.
var kafkaCommands = []string{"promotion", "catalog", "dev", "dlq-replay", "audit", "rebuild"}

// TestKafkaSecurity_SecretsNeverLogged: with the password in the environment
// or in a file, no log line of a pipeline run at debug level, no /metrics, no
// --help of any Kafka command and no refusal prints it.
func TestKafkaSecurity_SecretsNeverLogged(t *testing.T) {
	t.Parallel()
	b := secureBroker(t)
	env := saslEnv(b, kafkakit.MechanismSCRAMSHA512)
	passwordFile := filepath.Join(t.TempDir(), "kafka-password")
	require.NoError(t, os.WriteFile(passwordFile, []byte(b.Password+"\n"), 0o600))
	p := startPipeline(t, env, "KAFKA_SASL_PASSWORD", "", "KAFKA_SASL_PASSWORD_FILE", passwordFile)
	p.purchaseReachesItsCard(t)

	seen := map[string]string{}
	for name, addr := range map[string]string{"promotion": p.promotionAddr, "catalog": p.catalogAddr} {
		for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
			_, seen[name+" "+path] = call(t, "GET", "http://"+addr+path, "", "")
			_, seen[name+" internal "+path] = call(t, "GET", "http://"+internalOf(addr)+path, "", "")
		}
	}
	p.promotion.stop()
	p.catalog.stop()
	seen["promotion logs"], seen["catalog logs"] = p.promotion.output(), p.catalog.output()
	require.Contains(t, seen["catalog logs"], `"protocol":"SASL_SSL"`, "the catalog read its password from the file")

	for _, cmd := range kafkaCommands {
		code, out := runCommand(t, env, time.Minute, cmd, "--help")
		require.Zero(t, code, out)
		for _, setting := range []string{"KAFKA_BROKERS", "KAFKA_TLS", "KAFKA_TLS_CA_FILE", "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE",
			"KAFKA_TLS_SERVER_NAME", "KAFKA_TLS_INSECURE_SKIP_VERIFY", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME",
			"KAFKA_SASL_PASSWORD", "KAFKA_SASL_PASSWORD_FILE"} {
			require.Contains(t, out, "$"+setting+" ", "promoflow %s --help names %s", cmd, setting)
		}
		seen[cmd+" --help"] = out
	}
	_, seen["promotion --kafka-sasl-password=... --help"] = runCommand(t, env, time.Minute, "promotion", "--kafka-sasl-password="+b.Password, "--help")
	seen["a refusal"] = requireRefused(t, with(env, "KAFKA_TLS_CA_FILE", b.Certs.UntrustedCAFile), "certificate not trusted")

	for where, text := range seen {
		for i, line := range strings.Split(text, "\n") {
			require.NotContains(t, line, b.Password, "%s, line %d prints the password", where, i+1)
		}
	}
}

// TestKafkaSecurity_OperatorCommandsUseTheSameSettings: dlq-replay --list,
// audit --replica and rebuild (then rebuild --status) read the topics of a
// SASL_SSL broker from the same KAFKA_* settings as the processes.
func TestKafkaSecurity_OperatorCommandsUseTheSameSettings(t *testing.T) {
	t.Parallel()
	b := secureBroker(t)
	p := startPipeline(t, saslEnv(b, kafkakit.MechanismSCRAMSHA512))
	p.purchaseReachesItsCard(t)
	producePoison(t, b, p.topic)

	// The catalog dead-letters the poison record; the listing shows it.
	var code int
	var out string
	require.Eventually(t, func() bool {
		code, out = runCommand(t, p.env, time.Minute, "dlq-replay", "--list")
		return code != 0 || strings.Contains(out, "1 records in "+p.dlqTopic)
	}, 60*time.Second, time.Second, "dlq-replay --list never showed the dead letter")
	require.Zero(t, code, out)

	code, out = runCommand(t, p.env, time.Minute, "audit", "--replica")
	require.Zero(t, code, out)
	require.Contains(t, out, "replica: 1 purchases on the topic, 0 drifted")

	code, out = runCommand(t, p.env, 2*time.Minute, "rebuild")
	require.Zero(t, code, out)
	status := runCommandToEnd(t, p.env, time.Minute, "rebuild", "--status")
	out = status.output()
	require.Zero(t, status.cmd.ProcessState.ExitCode(), out)
	var st struct {
		State     string
		Purchases int64
		Skipped   int64
	}
	require.NoError(t, json.Unmarshal([]byte(status.stdout.String()), &st), out)
	require.Equal(t, "done", st.State, out)
	require.EqualValues(t, 1, st.Purchases, "the purchase, read over SASL_SSL")
	require.EqualValues(t, 1, st.Skipped, "the poison record")

	// The same commands with a wrong password are refused at start.
	for _, args := range [][]string{{"dlq-replay", "--list"}, {"audit", "--replica"}, {"rebuild"}} {
		requireRefused(t, with(p.env, "KAFKA_SASL_PASSWORD", "wrong"), "authentication failed", args...)
	}
}

// producePoison writes a record that breaks the contract to topic, over SASL_SSL.
func producePoison(t *testing.T, b *kafkatest.SecureBroker, topic string) {
	t.Helper()
	sec, err := kafkakit.SecurityConfig{TLS: true, CAFile: b.Certs.CAFile, SASLMechanism: kafkakit.MechanismSCRAMSHA512,
		SASLUsername: b.User, SASLPassword: kafkakit.Secret(b.Password)}.Load()
	require.NoError(t, err)
	cluster := kafkakit.Cluster{Brokers: []string{b.SASLSSL}, Security: sec}
	producer, err := sarama.NewSyncProducer(cluster.Brokers, cluster.DurableProducerConfig("promoflow-test"))
	require.NoError(t, err)
	defer producer.Close()
	_, _, err = producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(uuid.NewString()),
		Value:   sarama.ByteEncoder(bytes.Repeat([]byte("x"), 8)),
		Headers: []sarama.RecordHeader{{Key: []byte("_watermill_message_uuid"), Value: []byte(uuid.NewString())}}})
	require.NoError(t, err)
}
