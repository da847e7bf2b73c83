package pgtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/tlstest"
)

// CA is a certificate authority made afresh for one test: nothing that looks
// like a real secret is ever committed.
type CA struct {
	ca *tlstest.CA
	// PEM is the CA certificate, what a client trusts (sslrootcert).
	PEM []byte
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := tlstest.NewCA(name)
	require.NoError(t, err)
	return &CA{ca: ca, PEM: ca.CertPEM()}
}

// Issue signs a server certificate for hosts (IP addresses or DNS names) and
// returns it and its private key, both PEM.
func (ca *CA) Issue(t testing.TB, hosts ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	kp, err := ca.ca.Issue(hosts[0], tlstest.Server, hosts...)
	require.NoError(t, err)
	return kp.CertPEM(), kp.KeyPEM()
}

// WriteFile writes the CA certificate into a folder of the test's own and
// returns its path.
func (ca *CA) WriteFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(path, ca.PEM, 0o644))
	return path
}
