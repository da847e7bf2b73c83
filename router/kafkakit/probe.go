package kafkakit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// The causes of a connection that the brokers refuse whatever the number of
// retries: only the settings can fix them. A *RefusedError wraps one.
var (
	ErrAuthenticationFailed  = errors.New("authentication failed")
	ErrCertificateNotTrusted = errors.New("certificate not trusted")
	ErrOtherProtocol         = errors.New("the listener speaks another protocol")
)

// RefusedError is a connection refused for one of the causes above.
type RefusedError struct {
	// Brokers are the addresses probed.
	Brokers string
	// Cause is ErrAuthenticationFailed, ErrCertificateNotTrusted or ErrOtherProtocol.
	Cause error
	// Detail says what was seen.
	Detail string
	// Err is the client's own error, when it adds to Detail.
	Err error
}

func (e *RefusedError) Error() string {
	msg := "kafka " + e.Brokers + ": " + e.Cause.Error() + ": " + e.Detail
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *RefusedError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Cause}
	}
	return []error{e.Cause, e.Err}
}

// ProbeTimeout bounds Probe: it answers within it whatever the brokers do.
const ProbeTimeout = 20 * time.Second

// probeIOTimeout bounds each dial, read and write of a probe.
const probeIOTimeout = 5 * time.Second

// Probe fetches the cluster's metadata once, as every client will, and names
// the cause when the brokers refuse: a *RefusedError for a refusal that no
// retry can fix (wrong credentials, a certificate not trusted, a listener of
// another protocol), another error when no broker answers. It answers within
// ProbeTimeout and never retries.
func (c Cluster) Probe(ctx context.Context) error {
	return c.within(ctx, c.probe)
}

// Ping fetches the cluster's metadata once, with short timeouts and no
// retry: whether the brokers answer now. It answers within ProbeTimeout.
func (c Cluster) Ping(ctx context.Context) error {
	return c.within(ctx, func(brokers string) error {
		if err := c.fetchMetadata(); err != nil {
			return fmt.Errorf("kafka %s: %w", brokers, err)
		}
		return nil
	})
}

// within runs f and answers within ProbeTimeout, or when ctx ends.
func (c Cluster) within(ctx context.Context, f func(brokers string) error) error {
	if err := c.Validate(); err != nil {
		return err
	}
	brokers := strings.Join(c.Brokers, ",")
	done := make(chan error, 1)
	go func() { done <- f(brokers) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(ProbeTimeout):
		return fmt.Errorf("kafka %s: no answer within %s", brokers, ProbeTimeout)
	}
}

func (c Cluster) probe(brokers string) error {
	err := c.fetchMetadata()
	if err == nil {
		return nil
	}
	// Sarama wraps each broker's error in "run out of available brokers".
	inner := err
	if u := errors.Unwrap(err); u != nil && errors.Is(err, sarama.ErrOutOfBrokers) {
		inner = u
	}
	if refused := c.classify(brokers, inner); refused != nil {
		return refused
	}
	// A listener of another protocol just closes the connection (EOF): ask
	// the first broker what it does speak.
	if cause, detail := c.diagnose(c.Brokers[0]); cause != nil {
		return &RefusedError{Brokers: brokers, Cause: cause, Detail: detail}
	}
	return fmt.Errorf("kafka %s: %w", brokers, err)
}

// fetchMetadata connects a client with short timeouts and no retry.
func (c Cluster) fetchMetadata() error {
	sc := c.ClientConfig("promoflow-probe")
	sc.Net.DialTimeout, sc.Net.ReadTimeout, sc.Net.WriteTimeout = probeIOTimeout, probeIOTimeout, probeIOTimeout
	sc.Metadata.Retry.Max = 0
	sc.Metadata.Timeout = 2 * probeIOTimeout
	client, err := sarama.NewClient(c.Brokers, sc)
	if err != nil {
		return err
	}
	return client.Close()
}

// classify names the refusals that the client's error shows by itself.
func (c Cluster) classify(brokers string, err error) *RefusedError {
	s := c.Security
	var verify *tls.CertificateVerificationError
	var op *net.OpError
	switch {
	case errors.Is(err, sarama.ErrSASLAuthenticationFailed):
		return &RefusedError{Brokers: brokers, Cause: ErrAuthenticationFailed, Err: err,
			Detail: fmt.Sprintf("the brokers refused the %s credentials of user %q", s.mechanism, s.user)}
	case errors.Is(err, sarama.ErrUnsupportedSASLMechanism):
		return &RefusedError{Brokers: brokers, Cause: ErrAuthenticationFailed, Err: err,
			Detail: fmt.Sprintf("the brokers do not offer the SASL mechanism %s", s.mechanism)}
	case errors.As(err, &verify):
		detail := "the brokers' certificate does not verify against the system's roots"
		if s.caFile != "" {
			detail = "the brokers' certificate does not verify against the CA file " + s.caFile
		}
		if errors.As(verify.Err, new(x509.HostnameError)) {
			detail = "the brokers' certificate does not hold the name the client checks"
		}
		return &RefusedError{Brokers: brokers, Cause: ErrCertificateNotTrusted, Err: verify.Err, Detail: detail}
	case errors.As(err, &op) && op.Op == "remote error" && s.tls != nil:
		// The broker ended the TLS handshake with an alert: a listener that
		// requires client certificates refuses a missing or unknown one.
		// crypto/tls reports a received alert only as this net.OpError (its
		// alert type is unexported).
		detail := "the brokers refused the client certificate"
		if len(s.tls.Certificates) == 0 {
			detail = "the brokers require a client certificate (mutual TLS) and none is configured"
		}
		return &RefusedError{Brokers: brokers, Cause: ErrAuthenticationFailed, Detail: detail, Err: op}
	}
	return nil
}

// diagnose asks a broker that closed the connection what it speaks: TLS or
// not, SASL or not. It returns a nil cause when it cannot tell.
func (c Cluster) diagnose(addr string) (cause error, detail string) {
	s := c.Security
	tlsOn, saslOn := s.tls != nil, s.mechanism != ""
	speaksTLS := handshakes(addr)
	switch {
	case !tlsOn && speaksTLS:
		return ErrOtherProtocol, "it speaks TLS and the client connects without TLS"
	case tlsOn && !speaksTLS && answersAPIVersions(addr, Security{}):
		return ErrOtherProtocol, "it speaks plaintext and the client connects with TLS"
	case tlsOn != speaksTLS:
		return nil, ""
	case saslOn && (Cluster{Brokers: []string{addr}, Security: s.withoutSASL()}).fetchMetadata() == nil:
		return ErrOtherProtocol, "it takes no SASL authentication and the client authenticates with " + s.mechanism
	case !saslOn && answersAPIVersions(addr, s):
		// Kafka answers ApiVersions before authentication, then closes the
		// connection of a client that skips it.
		return ErrOtherProtocol, "it expects SASL authentication and the client sends none"
	}
	return nil, ""
}

func (s Security) withoutSASL() Security {
	s.mechanism, s.user, s.password = "", "", ""
	return s
}

// handshakes reports whether addr completes a TLS handshake, whatever its
// certificate: it only tells whether the listener speaks TLS.
func handshakes(addr string) bool {
	d := &net.Dialer{Timeout: probeIOTimeout}
	conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // nothing is sent over it
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// answersAPIVersions reports whether addr answers a Kafka ApiVersions request
// sent with the security's TLS (SASL is left out: it comes after).
func answersAPIVersions(addr string, s Security) bool {
	sc := (Cluster{Security: s.withoutSASL()}).ClientConfig("promoflow-probe")
	sc.Net.DialTimeout, sc.Net.ReadTimeout, sc.Net.WriteTimeout = probeIOTimeout, probeIOTimeout, probeIOTimeout
	// Only the request below: a SASL listener takes one ApiVersions before
	// the handshake, and closes the connection at a second one.
	sc.ApiVersionsRequest = false
	b := sarama.NewBroker(addr)
	if err := b.Open(sc); err != nil {
		return false
	}
	defer b.Close() //nolint:errcheck // a probe's connection
	_, err := b.ApiVersions(&sarama.ApiVersionsRequest{Version: 0})
	return err == nil
}
