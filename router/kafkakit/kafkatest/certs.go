package kafkatest

import (
	"os"
	"path/filepath"

	"github.com/promoflow/promoflow/router/tlstest"
)

// Certs are PEM files made afresh for one test broker: a CA that signs the
// broker's certificate and a client's, and a second CA that signs another
// client's certificate and nothing the broker trusts.
type Certs struct {
	// CAFile signs BrokerFile and ClientCertFile.
	CAFile string
	// BrokerFile holds the broker's key and its certificate chain (for
	// 127.0.0.1 and localhost), as Kafka's PEM key store reads it.
	BrokerFile string
	// ClientCertFile and ClientKeyFile are a client certificate of CAFile.
	ClientCertFile, ClientKeyFile string
	// UntrustedCAFile is a CA that the broker does not trust.
	UntrustedCAFile string
	// UntrustedCertFile and UntrustedKeyFile are a client certificate of UntrustedCAFile.
	UntrustedCertFile, UntrustedKeyFile string
}

// MakeCerts writes a fresh set of Certs into dir.
func MakeCerts(dir string) (Certs, error) {
	c := Certs{
		CAFile: filepath.Join(dir, "ca.crt"), BrokerFile: filepath.Join(dir, "broker.pem"),
		ClientCertFile: filepath.Join(dir, "client.crt"), ClientKeyFile: filepath.Join(dir, "client.key"),
		UntrustedCAFile:   filepath.Join(dir, "untrusted-ca.crt"),
		UntrustedCertFile: filepath.Join(dir, "untrusted-client.crt"), UntrustedKeyFile: filepath.Join(dir, "untrusted-client.key"),
	}
	ca, err := tlstest.NewCA("promoflow test CA")
	if err != nil {
		return c, err
	}
	untrustedCA, err := tlstest.NewCA("promoflow untrusted test CA")
	if err != nil {
		return c, err
	}
	broker, err := ca.Issue("localhost", tlstest.Server, "localhost", "127.0.0.1")
	if err != nil {
		return c, err
	}
	client, err := ca.Issue("promoflow test client", tlstest.Client)
	if err != nil {
		return c, err
	}
	untrusted, err := untrustedCA.Issue("promoflow untrusted client", tlstest.Client)
	if err != nil {
		return c, err
	}
	files := map[string][]byte{
		c.CAFile:            ca.CertPEM(),
		c.UntrustedCAFile:   untrustedCA.CertPEM(),
		c.BrokerFile:        append(append(broker.KeyPEM(), broker.CertPEM()...), ca.CertPEM()...),
		c.ClientCertFile:    client.CertPEM(),
		c.ClientKeyFile:     client.KeyPEM(),
		c.UntrustedCertFile: untrusted.CertPEM(),
		c.UntrustedKeyFile:  untrusted.KeyPEM(),
	}
	for name, b := range files {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			return c, err
		}
	}
	return c, nil
}
