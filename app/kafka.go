package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// kafkaConfig is how every command that talks to Kafka reaches it: the
// brokers and the security of every connection (router/kafkakit builds the
// clients from it).
type kafkaConfig struct {
	Brokers  string
	Security kafkakit.SecurityConfig
}

func (c *kafkaConfig) register(s *settings) {
	sc := &c.Security
	s.str(&c.Brokers, "kafka-brokers", "KAFKA_BROKERS", "", "comma-separated Kafka bootstrap servers (required)")
	s.bool(&sc.TLS, "kafka-tls", "KAFKA_TLS", false, "connect to the brokers over TLS")
	s.str(&sc.CAFile, "kafka-tls-ca-file", "KAFKA_TLS_CA_FILE", "", "PEM file of the CAs that sign the brokers' certificates (empty: the system's roots)")
	s.str(&sc.CertFile, "kafka-tls-cert-file", "KAFKA_TLS_CERT_FILE", "", "PEM client certificate, for brokers that require one (mutual TLS); goes with --kafka-tls-key-file")
	s.str(&sc.KeyFile, "kafka-tls-key-file", "KAFKA_TLS_KEY_FILE", "", "PEM private key of the client certificate")
	s.str(&sc.ServerName, "kafka-tls-server-name", "KAFKA_TLS_SERVER_NAME", "", "name the brokers' certificates must hold (empty: the host of each broker address)")
	s.bool(&sc.InsecureSkipVerify, "kafka-tls-insecure-skip-verify", "KAFKA_TLS_INSECURE_SKIP_VERIFY", false, "accept any broker certificate: for a laptop only, logs a warning at start")
	s.str(&sc.SASLMechanism, "kafka-sasl-mechanism", "KAFKA_SASL_MECHANISM", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: no SASL)")
	s.str(&sc.SASLUsername, "kafka-sasl-username", "KAFKA_SASL_USERNAME", "", "SASL user name")
	s.secret(&sc.SASLPassword, "kafka-sasl-password", "KAFKA_SASL_PASSWORD", "SASL password (never printed); or --kafka-sasl-password-file")
	s.str(&sc.SASLPasswordFile, "kafka-sasl-password-file", "KAFKA_SASL_PASSWORD_FILE", "", "file that holds the SASL password, such as a mounted secret")
}

func (c kafkaConfig) validate() error {
	var errs []error
	if len(splitList(c.Brokers)) == 0 {
		errs = append(errs, errors.New("kafka brokers are required (--kafka-brokers or $KAFKA_BROKERS)"))
	}
	return errors.Join(append(errs, c.Security.Validate())...)
}

// cluster reads the security's files: every Kafka client of the command is
// built from the cluster it returns.
func (c kafkaConfig) cluster() (kafkakit.Cluster, error) {
	sec, err := c.Security.Load()
	if err != nil {
		return kafkakit.Cluster{}, err
	}
	return kafkakit.Cluster{Brokers: splitList(c.Brokers), Security: sec}, nil
}

// connect is cluster, then one metadata request to the brokers: a refusal
// (wrong credentials, a certificate not trusted, a listener of another
// protocol) ends the command at start with its cause and the settings to
// check, before anything reports ready.
func (c kafkaConfig) connect(ctx context.Context, log *slog.Logger) (kafkakit.Cluster, error) {
	cluster, err := c.cluster()
	if err != nil {
		return kafkakit.Cluster{}, err
	}
	sec := cluster.Security
	log.Info("kafka", "brokers", c.Brokers, "security", sec)
	if sec.InsecureSkipVerify() {
		log.Warn("KAFKA_TLS_INSECURE_SKIP_VERIFY is on: the brokers' certificates are not verified, so anyone on the path can read and change the traffic; use it on a laptop only")
	}
	if sec.Protocol() == "SASL_PLAINTEXT" && c.Security.SASLMechanism == kafkakit.MechanismPlain {
		log.Warn("SASL PLAIN without TLS sends the password in clear text; set KAFKA_TLS=true")
	}
	if err := cluster.Probe(ctx); err != nil {
		return kafkakit.Cluster{}, c.withHint(err)
	}
	return cluster, nil
}

// withHint adds to a refused connection the settings that fix it.
func (c kafkaConfig) withHint(err error) error {
	sasl := "check KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE)"
	cert := "KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE must be a client certificate and key of a CA the brokers trust"
	var hint string
	switch {
	case errors.Is(err, kafkakit.ErrAuthenticationFailed) && c.Security.SASLMechanism == "":
		hint = cert
	case errors.Is(err, kafkakit.ErrAuthenticationFailed) && c.Security.CertFile == "":
		hint = sasl
	case errors.Is(err, kafkakit.ErrAuthenticationFailed):
		hint = sasl + "; " + cert
	case errors.Is(err, kafkakit.ErrCertificateNotTrusted):
		hint = "KAFKA_TLS_CA_FILE must hold the CA that signed the brokers' certificates, and KAFKA_TLS_SERVER_NAME (default: the broker's host) a name they hold"
	case errors.Is(err, kafkakit.ErrOtherProtocol):
		hint = "KAFKA_TLS and KAFKA_SASL_MECHANISM must match the listener that KAFKA_BROKERS names (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL)"
	default:
		return err
	}
	return fmt.Errorf("%w\n  %s", err, hint)
}
