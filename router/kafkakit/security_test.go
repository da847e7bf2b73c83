package kafkakit_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

func TestSecurityConfig_InconsistentSettingsAreNamedTogether(t *testing.T) {
	err := kafkakit.SecurityConfig{CAFile: "ca.crt", CertFile: "client.crt", SASLMechanism: "GSSAPI"}.Validate()
	require.ErrorContains(t, err, "kafka tls settings are given but tls is off")
	require.ErrorContains(t, err, "give both or neither")
	require.ErrorContains(t, err, `kafka sasl mechanism "GSSAPI": want one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512`)
	require.ErrorContains(t, err, "kafka sasl username is required")
	require.ErrorContains(t, err, "kafka sasl password is required")

	err = kafkakit.SecurityConfig{SASLMechanism: kafkakit.MechanismPlain, SASLUsername: "u", SASLPassword: "p", SASLPasswordFile: "f"}.Validate()
	require.ErrorContains(t, err, "give the password or its file, not both")
	require.ErrorContains(t, kafkakit.SecurityConfig{SASLPassword: "p"}.Validate(), "no sasl mechanism")
	require.NoError(t, kafkakit.SecurityConfig{}.Validate(), "plaintext is the zero value")
}

// TestSecurityConfig_LoadReadsTheFilesAndSaysWhichFileIsWrong: the password
// file loses its line break, a CA file without a certificate is named, and
// no error carries a secret.
func TestSecurityConfig_LoadReadsTheFilesAndSaysWhichFileIsWrong(t *testing.T) {
	dir := t.TempDir()
	certs, err := kafkatest.MakeCerts(dir)
	require.NoError(t, err)
	pwFile := filepath.Join(dir, "password")
	require.NoError(t, os.WriteFile(pwFile, []byte("s3cret-from-file\n"), 0o600))

	sec, err := kafkakit.SecurityConfig{TLS: true, CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile,
		SASLMechanism: kafkakit.MechanismSCRAMSHA512, SASLUsername: "alice", SASLPasswordFile: pwFile}.Load()
	require.NoError(t, err)
	require.Equal(t, "SASL_SSL", sec.Protocol())
	sc := kafkakit.Cluster{Brokers: []string{"127.0.0.1:1"}, Security: sec}.ClientConfig("test")
	require.True(t, sc.Net.TLS.Enable)
	require.Len(t, sc.Net.TLS.Config.Certificates, 1)
	require.Equal(t, "s3cret-from-file", sc.Net.SASL.Password)
	require.NotNil(t, sc.Net.SASL.SCRAMClientGeneratorFunc)
	require.NoError(t, sc.Validate())

	_, err = kafkakit.SecurityConfig{TLS: true, CAFile: pwFile}.Load()
	require.ErrorContains(t, err, "kafka tls ca file "+pwFile+" holds no PEM certificate")
	_, err = kafkakit.SecurityConfig{TLS: true, CertFile: certs.ClientCertFile, KeyFile: pwFile}.Load()
	require.ErrorContains(t, err, "kafka tls client certificate")
	require.NotContains(t, err.Error(), "s3cret")
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	_, err = kafkakit.SecurityConfig{SASLMechanism: kafkakit.MechanismPlain, SASLUsername: "alice", SASLPasswordFile: empty}.Load()
	require.ErrorContains(t, err, "is empty")
}

// TestSecret_NeverPrints: fmt, JSON and slog print a placeholder.
func TestSecret_NeverPrints(t *testing.T) {
	cfg := kafkakit.SecurityConfig{SASLMechanism: kafkakit.MechanismPlain, SASLUsername: "alice", SASLPassword: "hunter2"}
	var out bytes.Buffer
	fmt.Fprintf(&out, "%v %+v %#v %s", cfg, cfg, cfg, cfg.SASLPassword)
	b, err := json.Marshal(cfg)
	require.NoError(t, err)
	out.Write(b)
	slog.New(slog.NewJSONHandler(&out, nil)).Info("config", "cfg", cfg, "password", cfg.SASLPassword)
	sec, err := cfg.Load()
	require.NoError(t, err)
	slog.New(slog.NewJSONHandler(&out, nil)).Info("security", "security", sec)
	fmt.Fprintf(&out, "%v %+v", sec, sec)

	require.NotContains(t, out.String(), "hunter2")
	require.Contains(t, out.String(), "[redacted]")
}
