package kafkatest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
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
	ca, err := newCert("promoflow test CA", nil, certCA)
	if err != nil {
		return c, err
	}
	untrustedCA, err := newCert("promoflow untrusted test CA", nil, certCA)
	if err != nil {
		return c, err
	}
	broker, err := newCert("localhost", ca, certServer)
	if err != nil {
		return c, err
	}
	client, err := newCert("promoflow test client", ca, certClient)
	if err != nil {
		return c, err
	}
	untrusted, err := newCert("promoflow untrusted client", untrustedCA, certClient)
	if err != nil {
		return c, err
	}
	files := map[string][]byte{
		c.CAFile:            ca.certPEM(),
		c.UntrustedCAFile:   untrustedCA.certPEM(),
		c.BrokerFile:        append(append(broker.keyPEM(), broker.certPEM()...), ca.certPEM()...),
		c.ClientCertFile:    client.certPEM(),
		c.ClientKeyFile:     client.keyPEM(),
		c.UntrustedCertFile: untrusted.certPEM(),
		c.UntrustedKeyFile:  untrusted.keyPEM(),
	}
	for name, b := range files {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			return c, err
		}
	}
	return c, nil
}

type certKind int

const (
	certCA certKind = iota
	certServer
	certClient
)

type keyPair struct {
	cert *x509.Certificate
	key  *rsa.PrivateKey
}

// newCert makes a certificate signed by parent, or self-signed without one.
func newCert(name string, parent *keyPair, kind certKind) (*keyPair, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
	}
	switch kind {
	case certCA:
		tpl.IsCA, tpl.BasicConstraintsValid = true, true
		tpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	case certServer:
		tpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tpl.DNSNames = []string{"localhost"}
		tpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	case certClient:
		tpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	signer, signKey := tpl, key
	if parent != nil {
		signer, signKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, signer, &key.PublicKey, signKey)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &keyPair{cert: cert, key: key}, nil
}

func (k *keyPair) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: k.cert.Raw})
}

// keyPEM is PKCS#8, the form Kafka's PEM key store reads.
func (k *keyPair) keyPEM() []byte {
	der, _ := x509.MarshalPKCS8PrivateKey(k.key) // an RSA key always marshals
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}
