package kafkatest

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// SecureBroker is a Kafka node of the tests' own with the listeners of a
// production cluster: SASL_SSL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and SSL
// that requires client certificates, beside the PLAINTEXT listener the node
// uses itself. It runs the Kafka jars that scripts/stack.sh caches, with
// certificates and a password made afresh at each start.
type SecureBroker struct {
	// SASLSSL is the address of the SASL_SSL listener.
	SASLSSL string
	// MutualTLS is the address of the SSL listener; it requires a client
	// certificate signed by Certs.CAFile.
	MutualTLS string
	// Plaintext is the address of the PLAINTEXT listener.
	Plaintext string
	// User and Password are accepted by every SASL mechanism of SASLSSL.
	User, Password string
	// Certs are the CA, the broker's and the clients' certificates.
	Certs Certs

	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// secureBrokerReady bounds the wait for a starting node.
const secureBrokerReady = 180 * time.Second

// StartSecureBroker formats and starts a SecureBroker in dir. Its ports come
// from $PROMOFLOW_SECURE_KAFKA_PORT (that port and the three above it) or,
// without it, from the kernel. The jars are in $PROMOFLOW_KAFKA_LIBS or in
// scripts/stack.sh's cache.
func StartSecureBroker(dir string) (*SecureBroker, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	libs, err := kafkaLibs(root)
	if err != nil {
		return nil, err
	}
	ports, err := brokerPorts()
	if err != nil {
		return nil, err
	}
	certs, err := MakeCerts(dir)
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	addr := func(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }
	b := &SecureBroker{
		SASLSSL: addr(ports[0]), MutualTLS: addr(ports[1]), Plaintext: addr(ports[2]),
		User: "promoflow", Password: hex.EncodeToString(secret), Certs: certs,
		dir: dir, exited: make(chan struct{}),
	}
	props := filepath.Join(dir, "server.properties")
	if err := os.WriteFile(props, []byte(b.properties(addr(ports[3]))), 0o600); err != nil {
		return nil, err
	}
	java := "java"
	if home := os.Getenv("JAVA_HOME"); home != "" {
		java = filepath.Join(home, "bin", "java")
	}
	jvm := []string{"-Dlog4j2.configurationFile=" + filepath.Join(root, "scripts", "kafka", "log4j2.yaml"),
		"-Dkafka.logs.dir=" + filepath.Join(dir, "logs"), "-Djava.awt.headless=true", "-cp", filepath.Join(libs, "*")}

	// SCRAM credentials live in the KRaft metadata: they are written at format time.
	format := exec.Command(java, append(jvm, "kafka.tools.StorageTool", "format", "--standalone",
		"-t", clusterID(), "-c", props,
		"--add-scram", "SCRAM-SHA-256=[name="+b.User+",password="+b.Password+"]",
		"--add-scram", "SCRAM-SHA-512=[name="+b.User+",password="+b.Password+"]")...)
	if out, err := format.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("format kafka storage: %w\n%s", err, out)
	}

	out, err := os.Create(filepath.Join(dir, "kafka.out"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	b.cmd = exec.Command(java, append(append([]string{"-Xmx512m", "-XX:+UseG1GC"}, jvm...), "kafka.Kafka", props)...)
	b.cmd.Stdout, b.cmd.Stderr = out, out
	// The node dies with the test binary, even when that one is killed.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start kafka: %w", err)
	}
	go func() { _ = b.cmd.Wait(); close(b.exited) }()
	if err := b.waitReady(); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

// properties is the node's configuration. Every SASL mechanism needs its own
// JAAS entry on the listener; PLAIN takes its users from it, SCRAM from the
// metadata log.
func (b *SecureBroker) properties(controller string) string {
	return strings.Join([]string{
		"process.roles=broker,controller",
		"node.id=1",
		"listeners=SASL_SSL://" + b.SASLSSL + ",SSL://" + b.MutualTLS + ",PLAINTEXT://" + b.Plaintext + ",CONTROLLER://" + controller,
		"advertised.listeners=SASL_SSL://" + b.SASLSSL + ",SSL://" + b.MutualTLS + ",PLAINTEXT://" + b.Plaintext,
		"listener.security.protocol.map=SASL_SSL:SASL_SSL,SSL:SSL,PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"inter.broker.listener.name=PLAINTEXT",
		"controller.listener.names=CONTROLLER",
		"controller.quorum.bootstrap.servers=" + controller,
		"log.dirs=" + filepath.Join(b.dir, "data"),
		"sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
		`listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_` + b.User + `="` + b.Password + `";`,
		"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;",
		"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;",
		"ssl.keystore.type=PEM",
		"ssl.keystore.location=" + b.Certs.BrokerFile,
		"ssl.truststore.type=PEM",
		"ssl.truststore.location=" + b.Certs.CAFile,
		"listener.name.ssl.ssl.client.auth=required",
		// One node: every internal topic has one replica.
		"default.replication.factor=1", "min.insync.replicas=1",
		"offsets.topic.replication.factor=1", "offsets.topic.num.partitions=1",
		"transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1", "transaction.state.log.num.partitions=1",
		"share.coordinator.state.topic.replication.factor=1", "share.coordinator.state.topic.min.isr=1",
		"share.coordinator.state.topic.num.partitions=1",
		"group.initial.rebalance.delay.ms=0", "num.partitions=1",
	}, "\n") + "\n"
}

// waitReady waits until a SCRAM client gets metadata over SASL_SSL.
func (b *SecureBroker) waitReady() error {
	sec, err := kafkakit.SecurityConfig{TLS: true, CAFile: b.Certs.CAFile, SASLMechanism: kafkakit.MechanismSCRAMSHA512,
		SASLUsername: b.User, SASLPassword: kafkakit.Secret(b.Password)}.Load()
	if err != nil {
		return err
	}
	cluster := kafkakit.Cluster{Brokers: []string{b.SASLSSL}, Security: sec}
	deadline := time.Now().Add(secureBrokerReady)
	for {
		client, err := sarama.NewClient(cluster.Brokers, cluster.ClientConfig("promoflow-test"))
		if err == nil {
			return client.Close()
		}
		select {
		case <-b.exited:
			return fmt.Errorf("kafka exited during start:\n%s", b.logTail())
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kafka not ready after %s: %w\n%s", secureBrokerReady, err, b.logTail())
		}
	}
}

// Stop ends the node: SIGTERM, then SIGKILL when it does not stop.
func (b *SecureBroker) Stop() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
}

func (b *SecureBroker) logTail() string {
	var s strings.Builder
	for _, name := range []string{filepath.Join(b.dir, "logs", "server.log"), filepath.Join(b.dir, "kafka.out")} {
		data, _ := os.ReadFile(name)
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&s, "--- %s ---\n%s", name, data)
	}
	return s.String()
}

// moduleRoot is the folder of go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// kafkaLibs is the folder of the Kafka jars: $PROMOFLOW_KAFKA_LIBS, or
// scripts/stack.sh's cache for the version of scripts/kafka/pom.xml.
func kafkaLibs(root string) (string, error) {
	if dir := os.Getenv("PROMOFLOW_KAFKA_LIBS"); dir != "" {
		return dir, nil
	}
	pom, err := os.ReadFile(filepath.Join(root, "scripts", "kafka", "pom.xml"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`<kafka.version>([^<]+)</kafka.version>`).FindSubmatch(pom)
	if m == nil {
		return "", errors.New("scripts/kafka/pom.xml names no kafka.version")
	}
	cache := os.Getenv("PROMOFLOW_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache", "promoflow")
	}
	dir := filepath.Join(cache, "kafka-"+string(m[1]), "libs")
	if _, err := os.Stat(filepath.Join(dir, "kafka_2.13-"+string(m[1])+".jar")); err != nil {
		return "", fmt.Errorf("no Kafka jars in %s: scripts/stack.sh up kafka (or scripts/test.sh) fetches them", dir)
	}
	return dir, nil
}

// brokerPorts are the node's four ports: SASL_SSL, SSL, PLAINTEXT, controller.
func brokerPorts() ([]int, error) {
	if base := os.Getenv("PROMOFLOW_SECURE_KAFKA_PORT"); base != "" {
		p, err := strconv.Atoi(base)
		if err != nil {
			return nil, fmt.Errorf("$PROMOFLOW_SECURE_KAFKA_PORT=%q: %w", base, err)
		}
		return []int{p, p + 1, p + 2, p + 3}, nil
	}
	ports := make([]int, 4)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// clusterID is a Kafka cluster id: 16 random bytes in unpadded base64url,
// not starting with "-" (the format command would read it as an option).
func clusterID() string {
	for {
		id := make([]byte, 16)
		_, _ = rand.Read(id)
		if s := base64.RawURLEncoding.EncodeToString(id); s[0] != '-' {
			return s
		}
	}
}
