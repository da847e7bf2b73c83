// Package tlstest makes certificate authorities and the certificates they
// sign, afresh for each test, so that nothing that looks like a real secret
// is ever committed. Every key is RSA 2048 in PKCS#8, the form both
// PostgreSQL and Kafka's PEM key store read.
package tlstest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Kind is what a certificate is for.
type Kind int

const (
	// Server is a server's certificate for the hosts it is issued for (it
	// may also authenticate as a client, as a broker does to another).
	Server Kind = iota + 1
	// Client is a client's certificate (mutual TLS).
	Client
)

// KeyPair is a certificate and its private key.
type KeyPair struct {
	cert *x509.Certificate
	key  *rsa.PrivateKey
}

// CA is a self-signed certificate authority.
type CA struct{ KeyPair }

// NewCA makes a self-signed CA named name, valid from an hour ago for a week.
func NewCA(name string) (*CA, error) {
	kp, err := newKeyPair(name, nil, func(tpl *x509.Certificate) {
		tpl.IsCA, tpl.BasicConstraintsValid = true, true
		tpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	})
	if err != nil {
		return nil, err
	}
	return &CA{*kp}, nil
}

// Issue signs a certificate named name of kind; a Server certificate is for
// hosts (IP addresses or DNS names).
func (ca *CA) Issue(name string, kind Kind, hosts ...string) (*KeyPair, error) {
	return newKeyPair(name, &ca.KeyPair, func(tpl *x509.Certificate) {
		tpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		tpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		if kind == Server {
			tpl.ExtKeyUsage = append(tpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tpl.IPAddresses = append(tpl.IPAddresses, ip)
			} else {
				tpl.DNSNames = append(tpl.DNSNames, h)
			}
		}
	})
}

// newKeyPair makes a certificate named name signed by parent, or self-signed
// without one; shape sets what it is for.
func newKeyPair(name string, parent *KeyPair, shape func(*x509.Certificate)) (*KeyPair, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(7 * 24 * time.Hour),
	}
	shape(tpl)
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
	return &KeyPair{cert: cert, key: key}, nil
}

// CertPEM is the certificate, PEM.
func (k *KeyPair) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: k.cert.Raw})
}

// KeyPEM is the private key, PKCS#8 PEM.
func (k *KeyPair) KeyPEM() []byte {
	der, _ := x509.MarshalPKCS8PrivateKey(k.key) // an RSA key always marshals
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}
