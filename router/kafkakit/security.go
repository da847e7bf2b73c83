package kafkakit

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/IBM/sarama"
)

// SASL mechanisms a client authenticates with.
const (
	MechanismPlain       = "PLAIN"
	MechanismSCRAMSHA256 = "SCRAM-SHA-256"
	MechanismSCRAMSHA512 = "SCRAM-SHA-512"
)

// Mechanisms are the SASL mechanisms SecurityConfig accepts.
var Mechanisms = []string{MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512}

// Secret is a value that never prints: its String, its JSON and its slog value
// are a placeholder, so a config that holds one can be logged or wrapped into
// an error without leaking it.
type Secret string

const redacted = "[redacted]"

func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString keeps %#v from printing the value.
func (s Secret) GoString() string { return s.String() }

// LogValue keeps slog from printing the value.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText keeps encoding/json and friends from printing the value.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// SecurityConfig is how every client reaches the brokers, as an operator gives
// it: TLS (optionally mutual) and SASL. Its zero value is plaintext without
// authentication.
type SecurityConfig struct {
	// TLS encrypts every connection and verifies the brokers' certificates.
	TLS bool
	// CAFile is a PEM file of the CAs that sign the brokers' certificates.
	// Defaults to the system's roots.
	CAFile string
	// CertFile and KeyFile are the client's PEM certificate and key, for
	// brokers that require client certificates (mutual TLS). Both or neither.
	CertFile, KeyFile string
	// ServerName is the name the brokers' certificates must hold. Defaults to
	// the host of each broker address.
	ServerName string
	// InsecureSkipVerify accepts any certificate: for a laptop only.
	InsecureSkipVerify bool
	// SASLMechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty: no SASL.
	SASLMechanism string
	// SASLUsername is the SASL user.
	SASLUsername string
	// SASLPassword is the SASL password; or give SASLPasswordFile.
	SASLPassword Secret
	// SASLPasswordFile is a file that holds the password (a mounted secret);
	// one trailing line break is dropped.
	SASLPasswordFile string
}

// Validate reports every inconsistent setting, without reading the files.
func (c SecurityConfig) Validate() error {
	var errs []error
	if !c.TLS && (c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != "" || c.InsecureSkipVerify) {
		errs = append(errs, errors.New("kafka tls settings are given but tls is off"))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("kafka tls client certificate and key go together: give both or neither"))
	}
	if c.SASLMechanism == "" {
		if c.SASLUsername != "" || c.SASLPassword != "" || c.SASLPasswordFile != "" {
			errs = append(errs, errors.New("kafka sasl credentials are given but no sasl mechanism"))
		}
		return errors.Join(errs...)
	}
	if !slices.Contains(Mechanisms, c.SASLMechanism) {
		errs = append(errs, fmt.Errorf("kafka sasl mechanism %q: want one of %s", c.SASLMechanism, strings.Join(Mechanisms, ", ")))
	}
	if c.SASLUsername == "" {
		errs = append(errs, errors.New("kafka sasl username is required with a sasl mechanism"))
	}
	switch {
	case c.SASLPassword == "" && c.SASLPasswordFile == "":
		errs = append(errs, errors.New("kafka sasl password is required with a sasl mechanism: give the password or its file"))
	case c.SASLPassword != "" && c.SASLPasswordFile != "":
		errs = append(errs, errors.New("kafka sasl password is given twice: give the password or its file, not both"))
	}
	return errors.Join(errs...)
}

// Load validates the settings and reads their files into the Security every
// client is built with. Its errors name the files, never what they hold.
func (c SecurityConfig) Load() (Security, error) {
	if err := c.Validate(); err != nil {
		return Security{}, err
	}
	s := Security{mechanism: c.SASLMechanism, user: c.SASLUsername, password: c.SASLPassword, caFile: c.CAFile}
	if c.SASLPasswordFile != "" {
		b, err := os.ReadFile(c.SASLPasswordFile)
		if err != nil {
			return Security{}, fmt.Errorf("kafka sasl password file: %w", err)
		}
		s.password = Secret(strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"))
		if s.password == "" {
			return Security{}, fmt.Errorf("kafka sasl password file %s is empty", c.SASLPasswordFile)
		}
	}
	if !c.TLS {
		return s, nil
	}
	s.tls = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // the operator's explicit choice, warned about at start
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return Security{}, fmt.Errorf("kafka tls ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return Security{}, fmt.Errorf("kafka tls ca file %s holds no PEM certificate", c.CAFile)
		}
		s.tls.RootCAs = pool
	}
	if c.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return Security{}, fmt.Errorf("kafka tls client certificate %s and key %s: %w", c.CertFile, c.KeyFile, err)
		}
		s.tls.Certificates = []tls.Certificate{pair}
	}
	return s, nil
}

// Security is the loaded form of a SecurityConfig: what every Sarama config
// of a Cluster gets. Its zero value is plaintext without authentication.
type Security struct {
	tls       *tls.Config // nil: no TLS
	caFile    string      // for messages only
	mechanism string      // empty: no SASL
	user      string
	password  Secret
}

// Protocol is the Kafka security protocol the clients speak: PLAINTEXT, SSL,
// SASL_PLAINTEXT or SASL_SSL.
func (s Security) Protocol() string {
	switch {
	case s.tls != nil && s.mechanism != "":
		return "SASL_SSL"
	case s.tls != nil:
		return "SSL"
	case s.mechanism != "":
		return "SASL_PLAINTEXT"
	}
	return "PLAINTEXT"
}

// InsecureSkipVerify reports whether the brokers' certificates go unchecked.
func (s Security) InsecureSkipVerify() bool { return s.tls != nil && s.tls.InsecureSkipVerify }

// String says what LogValue says, for fmt: fmt cannot reach the redaction of
// an unexported field, so Security prints itself.
func (s Security) String() string {
	out := s.Protocol()
	if s.mechanism != "" {
		out += " " + s.mechanism + " user " + s.user
	}
	if s.tls != nil && len(s.tls.Certificates) > 0 {
		out += " with a client certificate"
	}
	return out
}

// GoString keeps %#v from printing the password.
func (s Security) GoString() string { return "kafkakit.Security{" + s.String() + "}" }

// LogValue is what a start-up log says of the security: never the password.
func (s Security) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("protocol", s.Protocol())}
	if s.mechanism != "" {
		attrs = append(attrs, slog.String("saslMechanism", s.mechanism), slog.String("saslUsername", s.user))
	}
	if s.tls != nil {
		attrs = append(attrs, slog.Bool("clientCertificate", len(s.tls.Certificates) > 0),
			slog.Bool("insecureSkipVerify", s.tls.InsecureSkipVerify))
		if s.caFile != "" {
			attrs = append(attrs, slog.String("caFile", s.caFile))
		}
		if s.tls.ServerName != "" {
			attrs = append(attrs, slog.String("serverName", s.tls.ServerName))
		}
	}
	return slog.GroupValue(attrs...)
}

// apply sets the TLS and SASL parts of a Sarama config.
func (s Security) apply(c *sarama.Config) {
	if s.tls != nil {
		c.Net.TLS.Enable = true
		c.Net.TLS.Config = s.tls.Clone()
	}
	if s.mechanism == "" {
		return
	}
	c.Net.SASL.Enable = true
	c.Net.SASL.Mechanism = sarama.SASLMechanism(s.mechanism)
	// v1 wraps the exchange in SaslAuthenticate requests; Kafka 4 removed v0 (KIP-896).
	c.Net.SASL.Version = sarama.SASLHandshakeV1
	c.Net.SASL.Handshake = true
	c.Net.SASL.User = s.user
	c.Net.SASL.Password = string(s.password)
	if gen := scramClient(s.mechanism); gen != nil {
		c.Net.SASL.SCRAMClientGeneratorFunc = gen
	}
}
